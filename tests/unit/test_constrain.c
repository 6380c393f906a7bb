/* coordinator/api_constrain: JSON schemas compiled to grammars (documents that validate are
 * accepted, others refused, checked by running them through common/gram's automaton), the
 * refusals of unsupported schemas, the request parameters (response_format, grammar,
 * logit_bias), and the tool-call grammars of each format (outputs run token by token, markers as
 * special tokens: calls of the offered tools with valid arguments accepted and parsed back by
 * coordinator/chat_toolcall into those calls, others refused). */
#include "gram_test.h"

#include <cjson/cJSON.h>

#include "common/gram.h"
#include "coordinator/api_constrain.h"
#include "coordinator/api_params.h"
#include "coordinator/chat_reasoning.h"
#include "coordinator/chat_toolcall.h"

static gram *compile(const char *schema_json) {
    cJSON *s = cJSON_Parse(schema_json);
    REQUIRE(s);
    char *g = NULL, msg[512] = "";
    int rc = api_schema_to_gbnf(s, &g, msg, sizeof msg);
    cJSON_Delete(s);
    CHECKF(rc == MLA_OK, "%s: %s", schema_json, msg);
    if (rc) return NULL;
    gram *gr = NULL;
    mla_err e;
    CHECKF(gram_parse(&gr, g, strlen(g), &e) == MLA_OK, "%s", e.msg);
    free(g);
    return gr;
}

static void lang(const char *schema, const char *const *yes, const char *const *no) {
    gram_test_lang(compile(schema), schema, yes, no);
}

static void refused(const char *schema, const char *needle) {
    cJSON *s = cJSON_Parse(schema);
    REQUIRE(s);
    char *g = NULL, msg[512] = "";
    int rc = api_schema_to_gbnf(s, &g, msg, sizeof msg);
    cJSON_Delete(s);
    CHECKF(rc == MLA_ERR && !g && strstr(msg, needle), "%s: rc %d, message '%s' lacks '%s'", schema, rc, msg, needle);
    free(g);
}

static void test_schemas(void) {
    lang("{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"},\"b\":{\"type\":\"string\"}},"
         "\"required\":[\"a\"]}",
         (const char *[]){"{\"a\":1}", "{ \"a\": -20, \"b\": \"x\\n\\u00e9\" }", "{\"a\":0,\"b\":\"\"}", NULL},
         (const char *[]){"{}", "{\"b\":\"x\"}", "{\"a\":01}", "{\"a\":1.5}", "{\"a\":1,}", "{\"b\":\"\",\"a\":1}",
                          "{\"a\":1,\"c\":2}", NULL});
    lang("{\"properties\":{\"x\":{\"type\":\"boolean\"},\"y\":{\"type\":\"null\"},\"z\":{\"type\":\"number\"}}}",
         (const char *[]){"{}", "{\"y\":null}", "{\"x\":true,\"z\":-1.5e+3}", "{\"x\":false,\"y\":null,\"z\":0}", NULL},
         (const char *[]){"{\"z\":.5}", "{\"x\":1}", "{,\"y\":null}", NULL});
    lang("{\"type\":\"array\",\"items\":{\"enum\":[\"a\",1,null]},\"minItems\":1,\"maxItems\":2}",
         (const char *[]){"[\"a\"]", "[1, null]", NULL}, (const char *[]){"[]", "[1,1,1]", "[\"b\"]", NULL});
    lang("{\"type\":\"string\",\"minLength\":2,\"maxLength\":3}", (const char *[]){"\"ab\"", "\"a\\\"c\"", "\"\xc3\xa9\xc3\xa9\"", NULL},
         (const char *[]){"\"a\"", "\"abcd\"", NULL});
    lang("{\"anyOf\":[{\"type\":\"integer\"},{\"const\":{\"k\":[1,2]}}]}",
         (const char *[]){"7", "{\"k\":[1,2]}", NULL}, (const char *[]){"{\"k\":[1]}", "\"7\"", NULL});
    lang("{\"type\":[\"string\",\"null\"]}", (const char *[]){"null", "\"s\"", NULL}, (const char *[]){"1", NULL});
    lang("{\"$defs\":{\"n\":{\"type\":\"object\",\"properties\":{\"c\":{\"type\":\"array\",\"items\":{\"$ref\":\"#/$defs/n\"}}},"
         "\"required\":[\"c\"],\"additionalProperties\":false}},\"$ref\":\"#/$defs/n\"}",
         (const char *[]){"{\"c\":[]}", "{\"c\":[{\"c\":[]},{\"c\":[{\"c\":[]}]}]}", NULL},
         (const char *[]){"{\"c\":[{}]}", NULL});
    lang("{\"type\":\"object\",\"additionalProperties\":{\"type\":\"integer\"}}",
         (const char *[]){"{}", "{\"q\":1,\"r\":2}", NULL}, (const char *[]){"{\"q\":\"1\"}", NULL});
    lang("{\"type\":\"object\",\"additionalProperties\":false}", (const char *[]){"{}", "{ }", NULL},
         (const char *[]){"{\"a\":1}", NULL});
    lang("{\"title\":\"t\",\"description\":\"d\"}", (const char *[]){"1", "[{\"a\":null}]", "\"x\"", NULL},
         (const char *[]){"nul", "[1,]", NULL});
    lang("true", (const char *[]){"{}", NULL}, (const char *[]){"{", NULL});

    refused("{\"type\":\"string\",\"pattern\":\"a+\"}", "unsupported JSON-schema keyword 'pattern'");
    refused("{\"properties\":{\"a\":{\"format\":\"date\"}}}", "'format' (at #/properties/a)");
    refused("{\"type\":\"integer\",\"minimum\":1}", "'minimum'");
    refused("{\"type\":\"object\",\"required\":[\"a\"]}", "required property 'a'");
    refused("{\"type\":\"array\",\"maxItems\":5000}", "above 1000");
    refused("{\"type\":\"array\",\"minItems\":3,\"maxItems\":2}", "below");
    refused("{\"type\":\"widget\"}", "unknown type 'widget'");
    refused("{\"$ref\":\"http://x/y\"}", "only #/$defs/NAME");
    refused("{\"$ref\":\"#/$defs/q\"}", "points to nothing");
    refused("{\"$defs\":{\"a\":{\"$ref\":\"#/$defs/a\"}},\"$ref\":\"#/$defs/a\"}", "left recursion");
    refused("{\"anyOf\":[{\"type\":\"integer\"}],\"type\":\"integer\"}", "together with other keywords");
    /* a 'type' beside enum or const that every value has (Pydantic's Enum and Literal) */
    lang("{\"enum\":[\"red\",\"green\"],\"type\":\"string\",\"title\":\"Color\"}",
         (const char *[]){"\"red\"", "\"green\"", NULL}, (const char *[]){"\"blue\"", "1", NULL});
    lang("{\"const\":3,\"type\":[\"integer\",\"null\"]}", (const char *[]){"3", NULL}, (const char *[]){"4", NULL});
    refused("{\"enum\":[\"a\",1],\"type\":\"string\"}", "not of the schema's 'type'");
    refused("{\"const\":1.5,\"type\":\"integer\"}", "not of the schema's 'type'");
    refused("{\"enum\":[\"a\"],\"type\":\"string\",\"minLength\":1}", "together with other keywords");
    refused("false", "admits no value");
    refused("{\"items\":[{\"type\":\"integer\"}]}", "prefixItems");
    char deep[2000] = "";
    for (int i = 0; i < 80; i++) strcat(deep, "{\"items\":");
    strcat(deep, "true");
    for (int i = 0; i < 80; i++) strcat(deep, "}");
    refused(deep, "nested deeper than 64");
    /* a schema of more than API_SCHEMA_MAX_NODES objects is refused before compiling; one at the
     * bound compiles */
    for (int n = API_SCHEMA_MAX_NODES - 1; n <= API_SCHEMA_MAX_NODES; n++) {
        cJSON *s = cJSON_CreateObject(), *alts = cJSON_AddArrayToObject(s, "anyOf");
        for (int i = 0; i < n; i++) {
            cJSON *o = cJSON_CreateObject();
            cJSON_AddStringToObject(o, "type", i % 2 ? "integer" : "string");
            cJSON_AddItemToArray(alts, o);
        }
        char *g = NULL, err[400] = "";
        int rc = api_schema_to_gbnf(s, &g, err, sizeof err);
        if (n < API_SCHEMA_MAX_NODES) CHECKF(rc == MLA_OK && g, "%d objects: %s", n + 1, err);
        else CHECKF(rc != MLA_OK && strstr(err, "more than 4096 objects"), "%d objects: %s", n + 1, err);
        free(g);
        cJSON_Delete(s);
    }
}

static int parse(const char *body, api_constrain *c, api_error *e) {
    cJSON *j = cJSON_Parse(body);
    REQUIRE(j);
    int rc = api_constrain_parse(c, j, e);
    cJSON_Delete(j);
    return rc;
}

/* end of generation: tokens 1 and 3 */
static bool eog13(void *ctx, int32_t id) {
    (void)ctx;
    return id == 1 || id == 3;
}

static void test_params(void) {
    api_constrain c;
    api_error e;
    CHECK(parse("{\"logit_bias\":{\"5\":-100,\"7\":2.5}}", &c, &e) == MLA_OK && c.n_bias == 2 && c.bias_ids[0] == 5 &&
          c.bias_vals[0] == -100.0f && c.bias_ids[1] == 7 && c.bias_vals[1] == 2.5f && !c.grammar);
    CHECK(api_constrain_check_ids(&c, 8, eog13, NULL, &e) == MLA_OK);
    CHECK(api_constrain_check_ids(&c, 7, eog13, NULL, &e) == MLA_ERR && e.status == 400 && strstr(e.message, "token id 7"));
    api_constrain_free(&c);
    /* a grammar's <[id]> naming an end-of-generation token: 400 (!<[id]> may name one) */
    CHECK(parse("{\"grammar\":\"root ::= \\\"a\\\" (<[2]> | <[3]>)\"}", &c, &e) == MLA_OK);
    CHECK(api_constrain_check_ids(&c, 8, NULL, NULL, &e) == MLA_OK);
    CHECK(api_constrain_check_ids(&c, 8, eog13, NULL, &e) == MLA_ERR && e.status == 400 &&
          strstr(e.message, "<[3]>, an end-of-generation token"));
    api_constrain_free(&c);
    CHECK(parse("{\"grammar\":\"root ::= (!<[1]>)* <[2]>\"}", &c, &e) == MLA_OK);
    CHECK(api_constrain_check_ids(&c, 8, eog13, NULL, &e) == MLA_OK);
    api_constrain_free(&c);
    CHECK(parse("{\"response_format\":{\"type\":\"json_object\"}}", &c, &e) == MLA_OK && c.grammar &&
          strstr(c.grammar, "root ::= jobj"));
    api_constrain_free(&c);
    /* json_object with llama.cpp's "schema": that schema's grammar */
    CHECK(parse("{\"response_format\":{\"type\":\"json_object\",\"schema\":{\"type\":\"integer\"}}}", &c, &e) ==
              MLA_OK &&
          c.grammar && !strstr(c.grammar, "root ::= jobj"));
    api_constrain_free(&c);
    CHECK(parse("{\"response_format\":{\"type\":\"text\"}}", &c, &e) == MLA_OK && !c.grammar);
    api_constrain_free(&c);
    CHECK(parse("{\"grammar\":\"root ::= [a-z]+\"}", &c, &e) == MLA_OK && c.grammar && !strcmp(c.grammar, "root ::= [a-z]+"));
    api_constrain_free(&c);
    const char *bad[][2] = {
        {"{\"logit_bias\":{\"-1\":1}}", "not a token id"},
        {"{\"logit_bias\":{\"1\":-100.5}}", "[-100, 100]"},
        {"{\"logit_bias\":{\"1\":\"x\"}}", "[-100, 100]"},
        {"{\"logit_bias\":[1]}", "must be an object"},
        {"{\"logit_bias\":{\"1\":1,\"01\":2}}", "twice"},
        {"{\"response_format\":{\"type\":\"json_schema\"}}", "json_schema' must be an object"},
        {"{\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"schema\":{}}}}", "name"},
        {"{\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"a\",\"schema\":{},\"x\":1}}}",
         "json_schema.x' is not supported"},
        {"{\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"a\",\"schema\":{\"not\":{}}}}}",
         "'not'"},
        {"{\"response_format\":{\"type\":\"json_object\"},\"grammar\":\"root ::= \\\"a\\\"\"}", "cannot be combined"},
        {"{\"response_format\":{\"type\":\"json_object\",\"schema\":{\"not\":{}}}}", "'response_format.schema'"},
        {"{\"response_format\":{\"type\":\"json_object\",\"schema\":5}}", "must be an object or a boolean"},
        {"{\"response_format\":{\"type\":\"text\",\"extra\":1}}", "'response_format.extra' does not apply"},
        {"{\"response_format\":{\"type\":\"text\",\"schema\":{}}}", "'response_format.schema' does not apply"},
        {"{\"response_format\":{\"type\":\"json_object\",\"json_schema\":{}}}", "json_schema' does not apply"},
        {"{\"response_format\":{\"type\":\"json_schema\",\"schema\":{},\"json_schema\":{\"name\":\"a\"}}}",
         "'response_format.schema' does not apply to type 'json_schema'"},
        {"{\"grammar\":\"rot ::= [a]\"}", "no 'root'"},
        {"{\"grammar\":5}", "must be a string"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        memset(&e, 0, sizeof e);
        int rc = parse(bad[i][0], &c, &e);
        CHECKF(rc == MLA_ERR && e.status == 400 && strstr(e.message, bad[i][1]), "%s: '%s' lacks '%s'", bad[i][0],
               e.message, bad[i][1]);
        CHECK(!c.grammar && !c.bias_ids && c.n_bias == 0);
    }
    char big[8000];
    size_t k = (size_t)snprintf(big, sizeof big, "{\"logit_bias\":{");
    for (int i = 0; i < 301; i++) k += (size_t)snprintf(big + k, sizeof big - k, "%s\"%d\":1", i ? "," : "", i);
    snprintf(big + k, sizeof big - k, "}}");
    CHECK(parse(big, &c, &e) == MLA_ERR && strstr(e.message, "at most 300"));
}

/* ---- tool-call grammars ------------------------------------------------------------------- */

static const char *const MK[] = {TOOLCALL_DS_CALLS_BEGIN,    TOOLCALL_DS_CALLS_END,     TOOLCALL_DS_CALL_BEGIN,
                                 TOOLCALL_DS_CALL_END,       TOOLCALL_DS_SEP,           TOOLCALL_KIMI_SECTION_BEGIN,
                                 TOOLCALL_KIMI_SECTION_END,  TOOLCALL_KIMI_CALL_BEGIN,  TOOLCALL_KIMI_ARG_BEGIN,
                                 TOOLCALL_KIMI_CALL_END,     TOOLCALL_GLM_CALL_BEGIN,   TOOLCALL_GLM_CALL_END,
                                 TOOLCALL_GLM_KEY_BEGIN,     TOOLCALL_GLM_KEY_END,      TOOLCALL_GLM_VAL_BEGIN,
                                 TOOLCALL_GLM_VAL_END,       REASONING_CLOSE_TAG,       REASONING_OPEN_TAG};
#define N_MK ((int)(sizeof MK / sizeof *MK))
#define MK0 1000 /* the markers' ids; 0-255 the bytes; TG_EOS the end of sequence */
#define TG_EOS 1100
static const char *g_missing; /* a marker the vocabulary lacks (NULL: none) */

static int32_t tg_tok(void *ud, const char *text) {
    (void)ud;
    for (int k = 0; k < N_MK; k++)
        if (!strcmp(text, MK[k])) return g_missing && !strcmp(text, g_missing) ? -1 : MK0 + k;
    return -1;
}

/* text as token ids: markers their special tokens, other bytes one token each */
static size_t tg_ids(const char *t, uint32_t *ids) {
    size_t n = 0;
    for (size_t i = 0; t[i];) {
        int hit = -1;
        for (int k = 0; k < N_MK && hit < 0; k++)
            if (!strncmp(t + i, MK[k], strlen(MK[k]))) hit = k;
        if (hit >= 0) {
            ids[n++] = (uint32_t)(MK0 + hit);
            i += strlen(MK[hit]);
        } else {
            ids[n++] = (unsigned char)t[i++];
        }
    }
    return n;
}

static const char *TOOLS =
    "[{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"strict\": true, \"parameters\": "
    "{\"type\": \"object\", \"properties\": {\"city\": {\"type\": \"string\", \"enum\": [\"Paris\", \"Oslo\"]}, "
    "\"days\": {\"type\": \"integer\"}}, \"required\": [\"city\", \"days\"], \"additionalProperties\": false}}},"
    " {\"type\": \"function\", \"function\": {\"name\": \"get_time\"}}]";

/* out through the grammar of q: accepted token by token and complete (want 2), accepted but not
 * complete (1), refused at some token (0); where complete and calls expected, parsed back into
 * calls of those names with those arguments (JSON text compared after parsing) */
static void tg_run(const api_tool_grammar *q, gram_vocab *v, const char *out, int want, const char *call0,
                   const char *args0) {
    char *gt = NULL, msg[600] = "";
    REQUIRE(api_constrain_tools(q, tg_tok, NULL, &gt, msg, sizeof msg) == MLA_OK);
    gram *g = NULL;
    gram_match *m = NULL;
    mla_err e = {{0}};
    REQUIRE(gram_parse(&g, gt, strlen(gt), &e) == MLA_OK && gram_match_new(&m, g, &e) == MLA_OK);
    uint32_t ids[4096];
    size_t n = tg_ids(out, ids);
    int got = 2;
    uint8_t *allow = malloc(gram_vocab_n(v));
    for (size_t i = 0; i < n && got; i++) {
        /* the mask agrees with taking the token */
        REQUIRE(gram_match_mask(m, v, allow, &e) >= 0);
        const bool ok = gram_match_accept_token(m, v, ids[i], &e) == MLA_OK;
        CHECKF(ok == (allow[ids[i]] != 0), "kind %d: token %zu of '%s': mask %d, taken %d", q->kind, i, out,
               allow[ids[i]], ok);
        if (!ok) got = 0;
    }
    if (got && !gram_match_complete(m)) got = 1;
    CHECKF(got == want, "kind %d%s%s: '%s': %d, expected %d", q->kind, q->required ? " required" : "",
           q->one_call ? " one call" : "", out, got, want);
    if (got == 2 && call0) {
        toolcall_result r;
        cJSON *tools = cJSON_Parse(TOOLS);
        toolcall_parse(q->kind, out, strlen(out), true, tools, NULL, &r);
        cJSON *a = r.n_calls ? cJSON_ParseWithLength(r.calls[0].args, r.calls[0].args_len) : NULL,
              *b = cJSON_Parse(args0);
        CHECKF(r.n_calls >= 1 && r.calls[0].name && !strcmp(r.calls[0].name, call0) && a && cJSON_Compare(a, b, 1),
               "kind %d: '%s' parsed into %d calls, the first %s %.*s", q->kind, out, r.n_calls,
               r.n_calls ? r.calls[0].name : "-", r.n_calls ? (int)r.calls[0].args_len : 1,
               r.n_calls ? r.calls[0].args : "-");
        cJSON_Delete(a);
        cJSON_Delete(b);
        cJSON_Delete(tools);
        toolcall_result_free(&r);
    }
    free(allow);
    gram_match_free(m);
    gram_free(g);
    free(gt);
}

static void test_tools(void) {
    gram_vocab *v = gram_vocab_new(TG_EOS + 1);
    for (uint32_t b = 0; b < 256; b++) {
        const uint8_t c = (uint8_t)b;
        gram_vocab_set(v, b, &c, 1);
    }
    for (int k = 0; k < N_MK; k++) gram_vocab_set_special(v, (uint32_t)(MK0 + k));
    gram_vocab_set_special(v, TG_EOS);
    gram_vocab_set_eos(v, TG_EOS);
    cJSON *tools = cJSON_Parse(TOOLS);
    REQUIRE(tools);
    const char *W = "{\"city\": \"Oslo\", \"days\": 2}";
    api_tool_grammar q = {.kind = TOOLCALL_DEEPSEEK, .tools = tools};
    /* DeepSeek: V3.1's form and V3's fenced one; free text before; a strict tool's arguments held
     * to its schema, a loose one's any object; the markers elsewhere refused */
    tg_run(&q, v, "Let me see.", 2, NULL, NULL);
    tg_run(&q, v, "<think>x</think>Sure." TOOLCALL_DS_CALLS_BEGIN TOOLCALL_DS_CALL_BEGIN "get_weather" TOOLCALL_DS_SEP
           "{\"city\": \"Oslo\", \"days\": 2}" TOOLCALL_DS_CALL_END TOOLCALL_DS_CALLS_END, 2, "get_weather", W);
    tg_run(&q, v, TOOLCALL_DS_CALLS_BEGIN TOOLCALL_DS_CALL_BEGIN "function" TOOLCALL_DS_SEP "get_weather\n```json\n"
           "{\"city\": \"Oslo\", \"days\": 2}\n```" TOOLCALL_DS_CALL_END "\n" TOOLCALL_DS_CALL_BEGIN "get_time"
           TOOLCALL_DS_SEP "{\"any\": [1]}" TOOLCALL_DS_CALL_END TOOLCALL_DS_CALLS_END, 2, "get_weather", W);
    tg_run(&q, v, TOOLCALL_DS_CALLS_BEGIN TOOLCALL_DS_CALL_BEGIN "get_weather" TOOLCALL_DS_SEP
           "{\"city\": \"Rome\", \"days\": 2}", 0, NULL, NULL);
    tg_run(&q, v, TOOLCALL_DS_CALLS_BEGIN TOOLCALL_DS_CALL_BEGIN "get_weather" TOOLCALL_DS_SEP "{\"city\": \"Oslo\"}",
           0, NULL, NULL);
    tg_run(&q, v, TOOLCALL_DS_CALLS_BEGIN TOOLCALL_DS_CALL_BEGIN "get_news" TOOLCALL_DS_SEP, 0, NULL, NULL);
    tg_run(&q, v, TOOLCALL_DS_CALLS_BEGIN "text", 0, NULL, NULL);
    tg_run(&q, v, TOOLCALL_DS_CALLS_BEGIN TOOLCALL_DS_CALL_BEGIN "get_time" TOOLCALL_DS_SEP "{}", 1, NULL, NULL);
    /* required: no end of sequence before a call; named: that tool alone; one call */
    q.required = true;
    tg_run(&q, v, "Let me see.", 1, NULL, NULL);
    q.only = "get_time";
    tg_run(&q, v, TOOLCALL_DS_CALLS_BEGIN TOOLCALL_DS_CALL_BEGIN "get_weather", 0, NULL, NULL);
    tg_run(&q, v, TOOLCALL_DS_CALLS_BEGIN TOOLCALL_DS_CALL_BEGIN "get_time" TOOLCALL_DS_SEP "{}" TOOLCALL_DS_CALL_END
           TOOLCALL_DS_CALLS_END, 2, "get_time", "{}");
    q.only = NULL;
    q.required = false;
    q.one_call = true;
    tg_run(&q, v, TOOLCALL_DS_CALLS_BEGIN TOOLCALL_DS_CALL_BEGIN "get_time" TOOLCALL_DS_SEP "{}" TOOLCALL_DS_CALL_END
           TOOLCALL_DS_CALL_BEGIN, 0, NULL, NULL);
    q.one_call = false;
    /* Kimi-K2 */
    q.kind = TOOLCALL_KIMI_K2;
    tg_run(&q, v, "<think>plan</think>" TOOLCALL_KIMI_SECTION_BEGIN TOOLCALL_KIMI_CALL_BEGIN "functions.get_weather:0"
           TOOLCALL_KIMI_ARG_BEGIN "{\"city\": \"Oslo\", \"days\": 2}" TOOLCALL_KIMI_CALL_END TOOLCALL_KIMI_SECTION_END,
           2, "get_weather", W);
    tg_run(&q, v, TOOLCALL_KIMI_SECTION_BEGIN TOOLCALL_KIMI_CALL_BEGIN "functions.get_weather:0" TOOLCALL_KIMI_ARG_BEGIN
           "{\"city\": \"Oslo\", \"days\": \"2\"}", 0, NULL, NULL);
    /* GLM: pairs in the schema's order, a string parameter the model's text, the others JSON */
    q.kind = TOOLCALL_GLM;
    tg_run(&q, v, "Checking." TOOLCALL_GLM_CALL_BEGIN "get_weather\n" TOOLCALL_GLM_KEY_BEGIN "city" TOOLCALL_GLM_KEY_END
           "\n" TOOLCALL_GLM_VAL_BEGIN "Oslo" TOOLCALL_GLM_VAL_END "\n" TOOLCALL_GLM_KEY_BEGIN "days" TOOLCALL_GLM_KEY_END
           TOOLCALL_GLM_VAL_BEGIN "2" TOOLCALL_GLM_VAL_END "\n" TOOLCALL_GLM_CALL_END "\n" TOOLCALL_GLM_CALL_BEGIN
           "get_time" TOOLCALL_GLM_KEY_BEGIN "x" TOOLCALL_GLM_KEY_END TOOLCALL_GLM_VAL_BEGIN "y" TOOLCALL_GLM_VAL_END
           TOOLCALL_GLM_CALL_END, 2, "get_weather", W);
    tg_run(&q, v, TOOLCALL_GLM_CALL_BEGIN "get_weather" TOOLCALL_GLM_KEY_BEGIN "days", 0, NULL, NULL);
    tg_run(&q, v, TOOLCALL_GLM_CALL_BEGIN "get_weather" TOOLCALL_GLM_KEY_BEGIN "city" TOOLCALL_GLM_KEY_END
           TOOLCALL_GLM_VAL_BEGIN "Rome", 0, NULL, NULL); /* not in its enum */
    tg_run(&q, v, TOOLCALL_GLM_CALL_BEGIN "get_time" TOOLCALL_GLM_KEY_BEGIN "x" TOOLCALL_GLM_KEY_END
           TOOLCALL_GLM_VAL_BEGIN "a" TOOLCALL_GLM_CALL_BEGIN, 0, NULL, NULL); /* a marker inside a value */
    tg_run(&q, v, TOOLCALL_GLM_CALL_BEGIN "get_weather" TOOLCALL_GLM_KEY_BEGIN "city" TOOLCALL_GLM_KEY_END
           TOOLCALL_GLM_VAL_BEGIN "Oslo" TOOLCALL_GLM_VAL_END TOOLCALL_GLM_KEY_BEGIN "days" TOOLCALL_GLM_KEY_END
           TOOLCALL_GLM_VAL_BEGIN "two", 0, NULL, NULL);
    /* the prompt opened the reasoning: it closes before a call (one inside it would be reasoning) */
    q.kind = TOOLCALL_DEEPSEEK;
    q.required = q.close_reasoning = true;
    tg_run(&q, v, TOOLCALL_DS_CALLS_BEGIN "x", 1, NULL, NULL); /* reasoning text, no call yet */
    tg_run(&q, v, "plan" REASONING_CLOSE_TAG "x", 1, NULL, NULL);
    tg_run(&q, v, "plan " TOOLCALL_DS_CALLS_BEGIN " more" REASONING_CLOSE_TAG TOOLCALL_DS_CALLS_BEGIN TOOLCALL_DS_CALL_BEGIN
           "get_time" TOOLCALL_DS_SEP "{}" TOOLCALL_DS_CALL_END TOOLCALL_DS_CALLS_END, 2, NULL, NULL);
    q.required = false;
    tg_run(&q, v, "still thinking", 2, NULL, NULL); /* auto: it may end inside the reasoning */
    q.close_reasoning = false;
    /* the prompt left the reasoning free (GLM-4.5 / 4.6 write "<think>" themselves): an output that
     * opens it (after whitespace) closes it before a call; any other start is content, which may
     * not open it later (the parser reads "<think>" only at the start) */
    q.kind = TOOLCALL_GLM;
    q.required = q.free_reasoning = true;
#define GLM_T TOOLCALL_GLM_CALL_BEGIN "get_time" TOOLCALL_GLM_CALL_END
    tg_run(&q, v, "\n" REASONING_OPEN_TAG "plan" GLM_T, 1, NULL, NULL); /* a call inside it is reasoning */
    tg_run(&q, v, "\n" REASONING_OPEN_TAG "plan" REASONING_CLOSE_TAG "\n" GLM_T, 2, "get_time", "{}");
    tg_run(&q, v, " " GLM_T, 2, "get_time", "{}");
    tg_run(&q, v, "Sure." GLM_T, 2, "get_time", "{}");
    tg_run(&q, v, "Sure. " REASONING_OPEN_TAG GLM_T, 2, "get_time", "{}"); /* text: a <think> later is content */
    tg_run(&q, v, " \n " REASONING_OPEN_TAG, 1, NULL, NULL);
    tg_run(&q, v, "Sure.", 1, NULL, NULL); /* required: no end before a call */
    q.required = false;
    tg_run(&q, v, REASONING_OPEN_TAG "plan", 2, NULL, NULL); /* auto: it may end inside the reasoning */
    tg_run(&q, v, "", 2, NULL, NULL);
    tg_run(&q, v, REASONING_OPEN_TAG "plan" GLM_T, 2, NULL, NULL); /* reasoning text, its markers too */
#undef GLM_T
    for (size_t k = 0; k < 2; k++) { /* the vocabulary lacks "<think>" or "</think>": not held */
        g_missing = k ? REASONING_CLOSE_TAG : REASONING_OPEN_TAG;
        q.required = true;
        tg_run(&q, v, REASONING_OPEN_TAG "plan" TOOLCALL_GLM_CALL_BEGIN "get_time" TOOLCALL_GLM_CALL_END, 2, NULL,
               NULL);
    }
    g_missing = NULL;
    q.required = q.free_reasoning = false;
    /* auto beside a JSON response_format: the format's JSON or the calls, from the first token (no
     * free text, no reasoning); a schema's JSON held to it; json_object (no schema) any object */
    cJSON *fsc = cJSON_Parse("{\"type\": \"object\", \"properties\": {\"answer\": {\"type\": \"string\"}}, "
                             "\"required\": [\"answer\"], \"additionalProperties\": false}");
    REQUIRE(fsc);
    const char *fcalls[3] = {
        TOOLCALL_DS_CALLS_BEGIN TOOLCALL_DS_CALL_BEGIN "get_weather" TOOLCALL_DS_SEP "{\"city\": \"Oslo\", \"days\": 2}"
            TOOLCALL_DS_CALL_END TOOLCALL_DS_CALLS_END,
        TOOLCALL_KIMI_SECTION_BEGIN TOOLCALL_KIMI_CALL_BEGIN "functions.get_weather:0" TOOLCALL_KIMI_ARG_BEGIN
            "{\"city\": \"Oslo\", \"days\": 2}" TOOLCALL_KIMI_CALL_END TOOLCALL_KIMI_SECTION_END,
        TOOLCALL_GLM_CALL_BEGIN "get_weather\n" TOOLCALL_GLM_KEY_BEGIN "city" TOOLCALL_GLM_KEY_END
            TOOLCALL_GLM_VAL_BEGIN "Oslo" TOOLCALL_GLM_VAL_END TOOLCALL_GLM_KEY_BEGIN "days" TOOLCALL_GLM_KEY_END
            TOOLCALL_GLM_VAL_BEGIN "2" TOOLCALL_GLM_VAL_END TOOLCALL_GLM_CALL_END};
    const enum toolcall_kind fkinds[3] = {TOOLCALL_DEEPSEEK, TOOLCALL_KIMI_K2, TOOLCALL_GLM};
    for (int k = 0; k < 3; k++) {
        api_tool_grammar qf = {.kind = fkinds[k], .tools = tools, .format = true, .format_schema = fsc};
        tg_run(&qf, v, "{\"answer\": \"Oslo\"}", 2, NULL, NULL);
        tg_run(&qf, v, fcalls[k], 2, "get_weather", W);
        tg_run(&qf, v, "{\"other\": 1}", 0, NULL, NULL);  /* outside the schema */
        tg_run(&qf, v, "Sure.", 0, NULL, NULL);           /* free text */
        tg_run(&qf, v, REASONING_OPEN_TAG "plan", 0, NULL, NULL);
        tg_run(&qf, v, "{\"answer\": \"x\"}" TOOLCALL_GLM_CALL_BEGIN, 0, NULL, NULL); /* nothing after the JSON */
        qf.format_schema = NULL;
        tg_run(&qf, v, "{\"other\": [1, 2]}", 2, NULL, NULL);
        tg_run(&qf, v, "[1]", 0, NULL, NULL);
    }
    cJSON_Delete(fsc);
    /* GLM: a property's $ref resolves against the parameters */
    cJSON *reft = cJSON_Parse("[{\"type\": \"function\", \"function\": {\"name\": \"f\", \"strict\": true, \"parameters\": "
                              "{\"type\": \"object\", \"$defs\": {\"P\": {\"type\": \"integer\"}}, \"properties\": "
                              "{\"p\": {\"$ref\": \"#/$defs/P\"}}, \"required\": [\"p\"]}}}]");
    api_tool_grammar qr = {.kind = TOOLCALL_GLM, .tools = reft};
    tg_run(&qr, v, TOOLCALL_GLM_CALL_BEGIN "f" TOOLCALL_GLM_KEY_BEGIN "p" TOOLCALL_GLM_KEY_END TOOLCALL_GLM_VAL_BEGIN "12"
           TOOLCALL_GLM_VAL_END TOOLCALL_GLM_CALL_END, 2, NULL, NULL);
    tg_run(&qr, v, TOOLCALL_GLM_CALL_BEGIN "f" TOOLCALL_GLM_KEY_BEGIN "p" TOOLCALL_GLM_KEY_END TOOLCALL_GLM_VAL_BEGIN "x", 0,
           NULL, NULL);
    cJSON_Delete(reft);
    /* GLM: a string's text within its minLength / maxLength (characters); a strict boolean is JSON's */
    cJSON *lent = cJSON_Parse("[{\"type\": \"function\", \"function\": {\"name\": \"f\", \"strict\": true, \"parameters\": "
                              "{\"type\": \"object\", \"properties\": {\"c\": {\"type\": [\"string\"], \"minLength\": 2, "
                              "\"maxLength\": 3}, \"b\": {\"type\": \"boolean\"}}, \"required\": [\"c\"]}}}]");
    api_tool_grammar ql = {.kind = TOOLCALL_GLM, .tools = lent};
#define GLM_C(v) TOOLCALL_GLM_CALL_BEGIN "f" TOOLCALL_GLM_KEY_BEGIN "c" TOOLCALL_GLM_KEY_END TOOLCALL_GLM_VAL_BEGIN v
    tg_run(&ql, v, GLM_C("ab") TOOLCALL_GLM_VAL_END TOOLCALL_GLM_CALL_END, 2, NULL, NULL);
    tg_run(&ql, v, GLM_C("\xc3\xa9\xc3\xa9\xc3\xa9") TOOLCALL_GLM_VAL_END TOOLCALL_GLM_CALL_END, 2, NULL, NULL);
    tg_run(&ql, v, GLM_C("a") TOOLCALL_GLM_VAL_END, 0, NULL, NULL);
    tg_run(&ql, v, GLM_C("abcd"), 0, NULL, NULL);
    tg_run(&ql, v, GLM_C("abc") TOOLCALL_GLM_VAL_END TOOLCALL_GLM_KEY_BEGIN "b" TOOLCALL_GLM_KEY_END
           TOOLCALL_GLM_VAL_BEGIN "True", 0, NULL, NULL); /* a strict boolean is JSON's */
#undef GLM_C
    cJSON_Delete(lent);
    /* the parser reads Python's literals where it reads a value as JSON (a tool that is not strict) */
    toolcall_result pr;
    cJSON *pyt = cJSON_Parse("[{\"type\": \"function\", \"function\": {\"name\": \"f\", \"parameters\": {\"type\": "
                             "\"object\", \"properties\": {\"b\": {\"type\": \"boolean\"}, \"n\": {\"type\": \"integer\"}}}}}]");
    const char *py = TOOLCALL_GLM_CALL_BEGIN "f" TOOLCALL_GLM_KEY_BEGIN "b" TOOLCALL_GLM_KEY_END TOOLCALL_GLM_VAL_BEGIN
        " True " TOOLCALL_GLM_VAL_END TOOLCALL_GLM_KEY_BEGIN "n" TOOLCALL_GLM_KEY_END TOOLCALL_GLM_VAL_BEGIN "None"
        TOOLCALL_GLM_VAL_END TOOLCALL_GLM_CALL_END;
    toolcall_parse(TOOLCALL_GLM, py, strlen(py), true, pyt, NULL, &pr);
    CHECKF(pr.n_calls == 1 && pr.calls[0].args_len == 19 && !memcmp(pr.calls[0].args, "{\"b\":true,\"n\":null}", 19),
           "Python's literals: %.*s", pr.n_calls ? (int)pr.calls[0].args_len : 1, pr.n_calls ? pr.calls[0].args : "-");
    toolcall_result_free(&pr);
    cJSON_Delete(pyt);
    /* a length bound on a value that may be another type: refused, not dropped */
    cJSON *mix = cJSON_Parse("[{\"type\": \"function\", \"function\": {\"name\": \"f\", \"strict\": true, \"parameters\": "
                             "{\"type\": \"object\", \"properties\": {\"c\": {\"anyOf\": [{\"type\": \"string\", "
                             "\"maxLength\": 3}, {\"type\": \"integer\"}]}}}}}]");
    api_tool_grammar qm = {.kind = TOOLCALL_GLM, .tools = mix};
    char *gm = NULL, mm[600] = "";
    CHECKF(api_constrain_tools(&qm, tg_tok, NULL, &gm, mm, sizeof mm) == MLA_ERR && gm == NULL &&
               strstr(mm, "parameter 'c'") && strstr(mm, "maxLength"),
           "%s", mm);
    cJSON_Delete(mix);
    /* DeepSeek: a tool named "function" only in the fenced form (the parser reads it so) */
    cJSON *fnt = cJSON_Parse("[{\"type\": \"function\", \"function\": {\"name\": \"function\"}}]");
    api_tool_grammar qf = {.kind = TOOLCALL_DEEPSEEK, .tools = fnt};
    tg_run(&qf, v, TOOLCALL_DS_CALLS_BEGIN TOOLCALL_DS_CALL_BEGIN "function" TOOLCALL_DS_SEP "{", 0, NULL, NULL);
    tg_run(&qf, v, TOOLCALL_DS_CALLS_BEGIN TOOLCALL_DS_CALL_BEGIN "function" TOOLCALL_DS_SEP "function\n```json\n{}\n```"
           TOOLCALL_DS_CALL_END TOOLCALL_DS_CALLS_END, 2, NULL, NULL);
    cJSON_Delete(fnt);
    /* a name the parsers would not give back (whitespace, '<'): refused */
    cJSON *wst = cJSON_Parse("[{\"type\": \"function\", \"function\": {\"name\": \"get weather\", \"strict\": true}}]");
    api_tool_grammar qw = {.kind = TOOLCALL_GLM, .tools = wst};
    char *gw = NULL, mw[600] = "";
    CHECKF(api_constrain_tools(&qw, tg_tok, NULL, &gw, mw, sizeof mw) == MLA_ERR && strstr(mw, "'get weather'"), "%s", mw);
    cJSON_Delete(wst);
    /* a marker the vocabulary does not hold as one token: named in the error */
    g_missing = TOOLCALL_GLM_KEY_END;
    char *gt = NULL, msg[600] = "";
    CHECK(api_constrain_tools(&q, tg_tok, NULL, &gt, msg, sizeof msg) == MLA_ERR && gt == NULL &&
          strstr(msg, "'</arg_key>' as one token"));
    g_missing = NULL;
    /* tool_choice required / named: a tool that is not strict held to its object schema where the
     * subset can (vLLM holds them); beyond the subset any object (GLM: any pairs); auto: free */
    cJSON *loose = cJSON_Parse("[{\"type\": \"function\", \"function\": {\"name\": \"set\", \"parameters\": "
                               "{\"type\": \"object\", \"properties\": {\"deg\": {\"type\": \"integer\"}}, "
                               "\"required\": [\"deg\"]}}}, {\"type\": \"function\", \"function\": {\"name\": "
                               "\"find\", \"parameters\": {\"type\": \"object\", \"properties\": {\"q\": "
                               "{\"anyOf\": [{\"type\": \"string\", \"pattern\": \"^a\"}, {\"type\": \"integer\"}]}}}}}]");
    api_tool_grammar ql2 = {.kind = TOOLCALL_DEEPSEEK, .tools = loose};
#define DS_CALL(n, a) TOOLCALL_DS_CALLS_BEGIN TOOLCALL_DS_CALL_BEGIN n TOOLCALL_DS_SEP a TOOLCALL_DS_CALL_END TOOLCALL_DS_CALLS_END
    tg_run(&ql2, v, DS_CALL("set", "{\"deg\": \"hot\"}"), 2, NULL, NULL); /* auto: any object */
    ql2.required = true;
    tg_run(&ql2, v, DS_CALL("set", "{\"deg\": \"hot\"}"), 0, NULL, NULL);
    tg_run(&ql2, v, DS_CALL("set", "{}"), 0, NULL, NULL);
    tg_run(&ql2, v, DS_CALL("set", "{\"deg\": 21}"), 2, NULL, NULL);
    tg_run(&ql2, v, DS_CALL("find", "{\"z\": [true]}"), 2, NULL, NULL); /* 'pattern': beyond the subset */
    ql2.only = "set";
    tg_run(&ql2, v, DS_CALL("set", "{\"deg\": 1.5}"), 0, NULL, NULL);
#undef DS_CALL
    ql2.kind = TOOLCALL_GLM;
    ql2.only = NULL;
#define GLM_CALL(n, k, x) TOOLCALL_GLM_CALL_BEGIN n TOOLCALL_GLM_KEY_BEGIN k TOOLCALL_GLM_KEY_END TOOLCALL_GLM_VAL_BEGIN x \
    TOOLCALL_GLM_VAL_END TOOLCALL_GLM_CALL_END
    tg_run(&ql2, v, GLM_CALL("set", "deg", "hot"), 0, NULL, NULL);
    tg_run(&ql2, v, GLM_CALL("set", "deg", "21"), 2, NULL, NULL);
    tg_run(&ql2, v, GLM_CALL("find", "z", "anything"), 2, NULL, NULL);
    ql2.required = false;
    tg_run(&ql2, v, GLM_CALL("set", "other", "hot"), 2, NULL, NULL);
#undef GLM_CALL
    cJSON_Delete(loose);
    /* a forced schema that passes the subset but not the grammar's check (a $ref cycle through
     * nothing but references): the calls go without the schemas of tools that are not strict;
     * strict, the same schema is a 400 */
    const char *cyc = "{\"type\": \"object\", \"$defs\": {\"X\": {\"$ref\": \"#/$defs/Y\"}, \"Y\": {\"$ref\": "
                      "\"#/$defs/X\"}}, \"properties\": {\"a\": {\"$ref\": \"#/$defs/X\"}}}";
    char cyc_tools[600];
    for (int strict = 0; strict < 2; strict++) {
        snprintf(cyc_tools, sizeof cyc_tools, "[{\"type\": \"function\", \"function\": {\"name\": \"f\", %s\"parameters\": %s}}]",
                 strict ? "\"strict\": true, " : "", cyc);
        cJSON *ct = cJSON_Parse(cyc_tools);
        for (int kind = 0; kind < 2; kind++) {
            api_tool_grammar qc = {.kind = kind ? TOOLCALL_GLM : TOOLCALL_DEEPSEEK, .tools = ct, .required = true};
            if (strict) {
                char *gc = NULL, mc[600] = "";
                CHECKF(api_constrain_tools(&qc, tg_tok, NULL, &gc, mc, sizeof mc) == MLA_ERR && !gc, "%s", mc);
            } else if (kind) {
                tg_run(&qc, v, TOOLCALL_GLM_CALL_BEGIN "f" TOOLCALL_GLM_KEY_BEGIN "b" TOOLCALL_GLM_KEY_END
                       TOOLCALL_GLM_VAL_BEGIN "1" TOOLCALL_GLM_VAL_END TOOLCALL_GLM_CALL_END, 2, NULL, NULL);
            } else {
                tg_run(&qc, v, TOOLCALL_DS_CALLS_BEGIN TOOLCALL_DS_CALL_BEGIN "f" TOOLCALL_DS_SEP "{\"b\": 1}"
                       TOOLCALL_DS_CALL_END TOOLCALL_DS_CALLS_END, 2, NULL, NULL);
            }
        }
        cJSON_Delete(ct);
    }
    /* a strict tool's schema outside the subset */
    cJSON *bad = cJSON_Parse("[{\"type\": \"function\", \"function\": {\"name\": \"f\", \"strict\": true, \"parameters\": "
                             "{\"type\": \"object\", \"properties\": {\"a\": {\"type\": \"string\", \"pattern\": \"x\"}}}}}]");
    api_tool_grammar qb = {.kind = TOOLCALL_DEEPSEEK, .tools = bad};
    CHECK(api_constrain_tools(&qb, tg_tok, NULL, &gt, msg, sizeof msg) == MLA_ERR && strstr(msg, "tool 'f' (strict)") &&
          strstr(msg, "'pattern'"));
    cJSON_Delete(bad);
    cJSON_Delete(tools);
    gram_vocab_free(v);
}

int main(void) {
    test_schemas();
    test_params();
    test_tools();
    return mla_test_finish();
}
