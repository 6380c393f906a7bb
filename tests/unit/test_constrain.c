/* coordinator/api_constrain: JSON schemas compiled to grammars (documents that validate are
 * accepted, others refused, checked by running them through common/gram's automaton), the
 * refusals of unsupported schemas, and the request parameters (response_format, grammar,
 * logit_bias). */
#include "gram_test.h"

#include <cjson/cJSON.h>

#include "common/gram.h"
#include "coordinator/api_constrain.h"
#include "coordinator/api_params.h"

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

static void test_params(void) {
    api_constrain c;
    api_error e;
    CHECK(parse("{\"logit_bias\":{\"5\":-100,\"7\":2.5}}", &c, &e) == MLA_OK && c.n_bias == 2 && c.bias_ids[0] == 5 &&
          c.bias_vals[0] == -100.0f && c.bias_ids[1] == 7 && c.bias_vals[1] == 2.5f && !c.grammar);
    CHECK(api_constrain_check_ids(&c, 8, &e) == MLA_OK);
    CHECK(api_constrain_check_ids(&c, 7, &e) == MLA_ERR && e.status == 400 && strstr(e.message, "token id 7"));
    api_constrain_free(&c);
    CHECK(parse("{\"response_format\":{\"type\":\"json_object\"}}", &c, &e) == MLA_OK && c.grammar &&
          strstr(c.grammar, "root ::= jobj"));
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

int main(void) {
    test_schemas();
    test_params();
    return mla_test_finish();
}
