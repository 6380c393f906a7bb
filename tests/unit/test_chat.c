/* Chat template tests.
 * usage: test_chat VOCAB_DUMP.json REF.json DATA_DIR [MODEL.gguf]
 *        test_chat --render TEMPLATE_FILE VARS.json   (prints the rendering)
 *        test_chat --render-batch JOBS.json           (renders many; tests/tok/jinja_compare.py)
 * - the fixture's chat prompts: the user question alone, rendered with the GGUF's template and
 *   tokenized, gives exactly the HF ids of ref.json; plain prompts are the template's prefix +
 *   the text;
 * - the released templates in DATA_DIR/cases.json render to the hand-derived expected text;
 * - the built-in templates, the fallback on unsupported features, and error reporting;
 * - GLM-5's released template (DATA_DIR/glm-5.jinja): the built-in glm template renders as it
 *   does, and the reasoning and tool-call parsers it selects are GLM's. */
#include "unit/mla_test.h"

#include "coordinator/chat.h"
#include "coordinator/chat_jinja.h"
#include "coordinator/chat_reasoning.h"
#include "coordinator/chat_toolcall.h"
#include "tok/tok_fixture.h"

static int render_mode(const char *tfile, const char *vfile) {
    size_t tl;
    char *t = tf_read_file(tfile, &tl);
    cJSON *vars = tf_read_json(vfile);
    if (!t || !vars) {
        fprintf(stderr, "cannot read %s or %s\n", tfile, vfile);
        return 2;
    }
    mla_err err = {{0}};
    jinja_tmpl *jt;
    int rc = jinja_parse(&jt, t, tl, &err);
    if (rc == JINJA_OK) {
        char *out;
        size_t ol;
        rc = jinja_render(jt, vars, &out, &ol, &err);
        if (rc == JINJA_OK) {
            fwrite(out, 1, ol, stdout);
            free(out);
        }
        jinja_free(jt);
    }
    if (rc != JINJA_OK) fprintf(stderr, "ERROR %d: %s\n", rc, err.msg);
    free(t);
    cJSON_Delete(vars);
    return rc == JINJA_OK ? 0 : 3;
}

/* [{"template": ..., "vars": {...}, "apply": bool}, ...] -> [{"ok": bool, "out": str, "err": str}, ...]
 * apply: rendered as a chat request is (chat_tmpl_apply_json), else by jinja_render alone. */
static int render_batch_mode(const char *file) {
    cJSON *jobs = tf_read_json(file);
    if (!jobs) return 2;
    cJSON *res = cJSON_CreateArray();
    const cJSON *j;
    cJSON_ArrayForEach(j, jobs) {
        const char *t = cJSON_GetObjectItemCaseSensitive(j, "template")->valuestring;
        mla_err err = {{0}};
        jinja_tmpl *jt;
        char *out = NULL;
        size_t ol = 0;
        const cJSON *vars = cJSON_GetObjectItemCaseSensitive(j, "vars");
        int rc;
        if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(j, "apply"))) {
            /* as a chat request: chat_tmpl_apply_json (messages normalized, the other variables
             * passed through) */
            const cJSON *b = cJSON_GetObjectItemCaseSensitive(vars, "bos_token");
            const cJSON *e = cJSON_GetObjectItemCaseSensitive(vars, "eos_token");
            chat_tmpl *ct = NULL;
            rc = chat_tmpl_new(&ct, t, strlen(t), CHAT_FAMILY_NONE, cJSON_IsString(b) ? b->valuestring : "",
                               cJSON_IsString(e) ? e->valuestring : "", &err);
            if (rc == MLA_OK) {
                cJSON *extra = cJSON_Duplicate(vars, 1);
                cJSON_DeleteItemFromObjectCaseSensitive(extra, "messages");
                cJSON_DeleteItemFromObjectCaseSensitive(extra, "add_generation_prompt");
                rc = chat_tmpl_apply_json(ct, cJSON_GetObjectItemCaseSensitive(vars, "messages"),
                                          cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(vars, "add_generation_prompt")),
                                          extra, &out, &ol, NULL, &err);
                cJSON_Delete(extra);
                chat_tmpl_free(ct);
            }
        } else {
            rc = jinja_parse(&jt, t, strlen(t), &err);
            if (rc == JINJA_OK) {
                rc = jinja_render(jt, vars, &out, &ol, &err);
                jinja_free(jt);
            }
        }
        cJSON *o = cJSON_CreateObject();
        cJSON_AddBoolToObject(o, "ok", rc == JINJA_OK);
        cJSON_AddStringToObject(o, "out", out ? out : "");
        cJSON_AddStringToObject(o, "err", rc == JINJA_OK ? "" : err.msg);
        cJSON_AddItemToArray(res, o);
        free(out);
    }
    char *s = cJSON_PrintUnformatted(res);
    fputs(s, stdout);
    free(s);
    cJSON_Delete(res);
    cJSON_Delete(jobs);
    return 0;
}

static char *text_of(const tok_vocab *v, int32_t id) {
    size_t l;
    const char *s = tok_token_text(v, id, &l);
    if (!s) return strdup("");
    char *r = malloc(l + 1);
    memcpy(r, s, l);
    r[l] = 0;
    return r;
}

static int ids_equal(const tok_ids *a, const cJSON *arr) {
    if (a->n != (size_t)cJSON_GetArraySize(arr)) return 0;
    for (size_t i = 0; i < a->n; i++)
        if (a->ids[i] != (int32_t)cJSON_GetArrayItem(arr, (int)i)->valuedouble) return 0;
    return 1;
}

/* removes every CONTROL token text from s (in place) and trims whitespace */
static char *strip_specials(const tok_vocab *v, const char *s) {
    char *o = strdup(s);
    for (size_t id = 0; id < tok_n_tokens(v); id++) {
        if (tok_token_type(v, (int32_t)id) != TOK_TYPE_CONTROL) continue;
        size_t l;
        const char *t = tok_token_text(v, (int32_t)id, &l);
        char *p;
        while (l && (p = memmem(o, strlen(o), t, l))) memmove(p, p + l, strlen(p + l) + 1);
    }
    char *b = o;
    while (*b == ' ' || *b == '\n') b++;
    size_t n = strlen(b);
    while (n && (b[n - 1] == ' ' || b[n - 1] == '\n')) n--;
    memmove(o, b, n);
    o[n] = 0;
    return o;
}

static void run_fixture(const tok_vocab *v, const chat_tmpl *ct, const cJSON *ref, const char *label) {
    mla_err err = {{0}};
    char *prefix = NULL;
    REQUIRE(chat_tmpl_prefix(ct, &prefix, &err) == MLA_OK);
    CHECK(strlen(prefix) > 0);
    const cJSON *it;
    int n_chat = 0, n_plain = 0;
    cJSON_ArrayForEach(it, cJSON_GetObjectItemCaseSensitive(ref, "prompts")) {
        const char *text = cJSON_GetObjectItemCaseSensitive(it, "text")->valuestring;
        const cJSON *ids = cJSON_GetObjectItemCaseSensitive(it, "tokens");
        tok_ids out = {0};
        if (!strncmp(text, prefix, strlen(prefix))) {
            /* a chat prompt: only the question is taken from the text */
            char *q = strip_specials(v, text);
            chat_msg m = {"user", q};
            char *rendered = NULL;
            const char *used = NULL;
            REQUIRE(chat_tmpl_apply(ct, &m, 1, true, NULL, &rendered, NULL, &used, &err) == MLA_OK);
            CHECKF(!strcmp(rendered, text), "%s: rendered \"%s\" != \"%s\"", label, rendered, text);
            CHECK(strstr(used, "gguf") != NULL);
            REQUIRE(tok_encode(v, rendered, strlen(rendered), false, true, &out, &err) == MLA_OK);
            CHECKF(ids_equal(&out, ids), "%s: chat prompt ids for \"%s\"", label, q);
            free(rendered);
            free(q);
            n_chat++;
        } else {
            size_t pl = strlen(prefix), l = strlen(text);
            char *full = malloc(pl + l + 1);
            memcpy(full, prefix, pl);
            memcpy(full + pl, text, l + 1);
            REQUIRE(tok_encode(v, full, pl + l, false, true, &out, &err) == MLA_OK);
            CHECKF(ids_equal(&out, ids), "%s: plain prompt \"%.50s\"", label, text);
            free(full);
            n_plain++;
        }
        tok_ids_free(&out);
    }
    CHECK(n_chat >= 1 && n_plain >= 1);
    free(prefix);
}

static void run_cases(const char *dir) {
    char path[4096];
    snprintf(path, sizeof path, "%s/cases.json", dir);
    cJSON *cases = tf_read_json(path);
    REQUIRE(cases);
    const cJSON *c;
    int n = 0;
    cJSON_ArrayForEach(c, cases) {
        const char *name = cJSON_GetObjectItemCaseSensitive(c, "name")->valuestring;
        snprintf(path, sizeof path, "%s/%s", dir, cJSON_GetObjectItemCaseSensitive(c, "template")->valuestring);
        size_t tl;
        char *t = tf_read_file(path, &tl);
        REQUIRE(t);
        mla_err err = {{0}};
        jinja_tmpl *jt;
        int rc = jinja_parse(&jt, t, tl, &err);
        CHECKF(rc == JINJA_OK, "%s: parse: %s", name, err.msg);
        if (rc == JINJA_OK) {
            char *out = NULL;
            rc = jinja_render(jt, cJSON_GetObjectItemCaseSensitive(c, "vars"), &out, NULL, &err);
            CHECKF(rc == JINJA_OK, "%s: render: %s", name, err.msg);
            const char *exp = cJSON_GetObjectItemCaseSensitive(c, "expected")->valuestring;
            if (rc == JINJA_OK) CHECKF(!strcmp(out, exp), "%s:\n got      \"%s\"\n expected \"%s\"", name, out, exp);
            free(out);
            jinja_free(jt);
        }
        free(t);
        n++;
    }
    CHECK(n >= 5);
    cJSON_Delete(cases);
}

static void run_builtin_and_errors(void) {
    mla_err err = {{0}};
    chat_msg conv[] = {{"system", "S"}, {"user", "hi"}, {"assistant", "yo"}, {"user", "q"}};
    char *out = NULL;
    const char *B = "<\xEF\xBD\x9C" "begin\xE2\x96\x81of\xE2\x96\x81sentence\xEF\xBD\x9C>";
    REQUIRE(chat_render_builtin(CHAT_FAMILY_DEEPSEEK3, conv, 4, true, B, NULL, &out, &err) == MLA_OK);
    CHECK(!strcmp(out, "<｜begin▁of▁sentence｜>S<｜User｜>hi<｜Assistant｜>yo<｜end▁of▁sentence｜><｜User｜>q<｜Assistant｜>"));
    free(out);
    REQUIRE(chat_render_builtin(CHAT_FAMILY_GLM, conv, 4, true, NULL, NULL, &out, &err) == MLA_OK);
    CHECK(!strcmp(out, "[gMASK]<sop><|system|>S<|user|>hi<|assistant|></think>yo<|user|>q<|assistant|><think>"));
    free(out);

    /* an unsupported feature at parse time: the built-in template is used and named */
    chat_tmpl *t = NULL;
    const char *src = "{% include 'other.jinja' %}";
    REQUIRE(chat_tmpl_new(&t, src, strlen(src), CHAT_FAMILY_GLM, NULL, NULL, &err) == MLA_OK);
    CHECK(strstr(chat_tmpl_used(t), "built-in glm") != NULL);
    CHECK(strstr(chat_tmpl_used(t), "include") != NULL);
    const char *used = NULL;
    REQUIRE(chat_tmpl_apply(t, conv + 1, 1, true, NULL, &out, NULL, &used, &err) == MLA_OK);
    CHECK(!strcmp(out, "[gMASK]<sop><|user|>hi<|assistant|><think>"));
    CHECK(strstr(used, "built-in") != NULL);
    free(out);
    chat_tmpl_free(t);
    /* ... and at render time (an unknown filter) */
    src = "{{ messages[0].content | wordwrap(5) }}";
    REQUIRE(chat_tmpl_new(&t, src, strlen(src), CHAT_FAMILY_DEEPSEEK3, B, NULL, &err) == MLA_OK);
    CHECK(strstr(chat_tmpl_used(t), "gguf") != NULL);
    /* no other template is tried at request time: the error is the request's */
    CHECK(chat_tmpl_apply(t, conv + 1, 1, true, NULL, &out, NULL, &used, &err) == JINJA_E_UNSUPPORTED);
    CHECK(strstr(err.msg, "wordwrap") != NULL && out == NULL);
    /* chat_render (no fallback) names the feature */
    CHECK(chat_render(src, conv + 1, 1, true, "", "", &out, &err) == JINJA_E_UNSUPPORTED);
    CHECK(strstr(err.msg, "wordwrap") != NULL);
    chat_tmpl_free(t);
    /* raise_exception is reported, not hidden */
    src = "{% if messages[0]['role'] != 'system' %}{{ raise_exception('roles must alternate') }}{% endif %}";
    REQUIRE(chat_tmpl_new(&t, src, strlen(src), CHAT_FAMILY_GLM, NULL, NULL, &err) == MLA_OK);
    CHECK(chat_tmpl_apply(t, conv + 1, 1, true, NULL, &out, NULL, &used, &err) == JINJA_E_RAISED);
    CHECK(strstr(err.msg, "roles must alternate") != NULL);
    chat_tmpl_free(t);
    /* syntax errors name the line */
    CHECK(chat_render("a\n{% if x %}b", conv, 1, false, "", "", &out, &err) == JINJA_E_SYNTAX);
    CHECK(strstr(err.msg, "line 2") != NULL);
    CHECK(chat_render("{{ 'a' + 1 }}", conv, 1, false, "", "", &out, &err) == JINJA_E_RUNTIME);
    /* resource limits */
    CHECK(chat_render("{% for i in range(10000000) %}x{% endfor %}", conv, 1, false, "", "", &out, &err) == JINJA_E_LIMIT);
    CHECK(chat_render("{{ 'x' * 1000000000 }}", conv, 1, false, "", "", &out, &err) == JINJA_E_LIMIT);
    CHECK(chat_render("{% macro f(n) %}{{ f(n) }}{% endmacro %}{{ f(1) }}", conv, 1, false, "", "", &out, &err) == JINJA_E_LIMIT);
    /* "developer" (OpenAI's newer name for "system") renders as "system" */
    {
        src = "{% for m in messages %}[{{ m.role }}:{{ m.content }}]{% endfor %}";
        REQUIRE(chat_tmpl_new(&t, src, strlen(src), CHAT_FAMILY_GLM, NULL, NULL, &err) == MLA_OK);
        cJSON *msgs = cJSON_Parse("[{\"role\":\"developer\",\"content\":\"D\"},{\"role\":\"user\",\"content\":\"u\"}]");
        REQUIRE(chat_tmpl_apply_json(t, msgs, false, NULL, &out, NULL, NULL, &err) == MLA_OK);
        CHECK(!strcmp(out, "[system:D][user:u]"));
        free(out);
        cJSON_Delete(msgs);
        chat_tmpl_free(t);
        /* "reasoning" (vLLM's newer name) reaches the template as reasoning_content; beside a string
         * reasoning_content the latter stays, beside a null one (as our answers give it) it is replaced */
        src = "{% for m in messages %}[{{ m.role }}:{{ m.reasoning_content }}|{{ m.content }}]{% endfor %}";
        REQUIRE(chat_tmpl_new(&t, src, strlen(src), CHAT_FAMILY_GLM, NULL, NULL, &err) == MLA_OK);
        msgs = cJSON_Parse("[{\"role\":\"assistant\",\"reasoning\":\"R\",\"content\":\"a\"},"
                           "{\"role\":\"assistant\",\"reasoning\":\"X\",\"reasoning_content\":\"C\",\"content\":\"b\"},"
                           "{\"role\":\"assistant\",\"reasoning_content\":null,\"reasoning\":\"N\",\"content\":\"c\"}]");
        REQUIRE(chat_tmpl_apply_json(t, msgs, false, NULL, &out, NULL, NULL, &err) == MLA_OK);
        CHECKF(!strcmp(out, "[assistant:R|a][assistant:C|b][assistant:N|c]"), "%s", out);
        free(out);
        cJSON_Delete(msgs);
        chat_tmpl_free(t);
    }
    /* no template and unknown family: an error */
    CHECK(chat_tmpl_new(&t, NULL, 0, CHAT_FAMILY_NONE, NULL, NULL, &err) == MLA_ERR);
    /* reasoning by the template: "</think>", or "<think>" alone (a generation prompt that opens it) */
    CHECK(reasoning_auto("{{ bos_token }}{% if add_generation_prompt %}<|Assistant|><think>\n{% endif %}") ==
          REASONING_DEEPSEEK_R1);
    CHECK(reasoning_auto("{% for m in messages %}{{ m.content }}{% endfor %}") == REASONING_NONE);
    CHECK(chat_family_guess("deepseek2", NULL) == CHAT_FAMILY_DEEPSEEK3);
    CHECK(chat_family_guess("glm-dsa", NULL) == CHAT_FAMILY_GLM);
    CHECK(chat_family_guess(NULL, "glm4") == CHAT_FAMILY_GLM);
}

static void run_glm5(const char *dir) {
    char path[4096];
    snprintf(path, sizeof path, "%s/glm-5.jinja", dir);
    size_t tl;
    char *src = tf_read_file(path, &tl);
    REQUIRE(src);
    CHECK(reasoning_auto(src) == REASONING_GLM);
    CHECK(toolcall_auto(src) == TOOLCALL_GLM);
    /* what the built-in glm template stands in for (chat_tmpl_new's fallback) */
    const chat_msg convs[][4] = {{{"system", "S"}, {"user", "hi"}, {"assistant", "yo"}, {"user", "q"}},
                                 {{"user", "q"}, {0}, {0}, {0}}};
    const size_t lens[] = {4, 1};
    mla_err err = {{0}};
    for (size_t k = 0; k < 2; k++)
        for (int gen = 0; gen < 2; gen++) {
            char *a = NULL, *b = NULL;
            REQUIRE(chat_render(src, convs[k], lens[k], gen, "", "", &a, &err) == MLA_OK);
            REQUIRE(chat_render_builtin(CHAT_FAMILY_GLM, convs[k], lens[k], gen, NULL, NULL, &b, &err) == MLA_OK);
            CHECKF(!strcmp(a, b), "glm-5.jinja against the built-in glm (conversation %zu, generation prompt %d):\n"
                                  " jinja    \"%s\"\n built-in \"%s\"", k, gen, a, b);
            free(a);
            free(b);
        }
    free(src);
}

int main(int argc, char **argv) {
    if (argc >= 4 && !strcmp(argv[1], "--render")) return render_mode(argv[2], argv[3]);
    if (argc >= 3 && !strcmp(argv[1], "--render-batch")) return render_batch_mode(argv[2]);
    REQUIRE(argc >= 4);
    cJSON *dump = tf_read_json(argv[1]);
    cJSON *ref = tf_read_json(argv[2]);
    REQUIRE(dump && ref);
    mla_err err = {{0}};
    tok_vocab *v = tf_vocab_from_dump(dump, &err);
    REQUIRE(v);
    const cJSON *tmpl = cJSON_GetObjectItemCaseSensitive(dump, "tokenizer.chat_template");
    REQUIRE(cJSON_IsString(tmpl));
    char *bos = text_of(v, tok_bos(v)), *eos = text_of(v, tok_eos(v));
    chat_tmpl *ct = NULL;
    enum chat_family fam = chat_family_guess(NULL, tok_pre_name(v));
    CHECK(fam != CHAT_FAMILY_NONE);
    REQUIRE(chat_tmpl_new(&ct, tmpl->valuestring, strlen(tmpl->valuestring), fam, bos, eos, &err) == MLA_OK);
    CHECK(!strcmp(chat_tmpl_used(ct), "gguf chat_template (jinja)"));
    run_fixture(v, ct, ref, "dump");
    chat_tmpl_free(ct);
    free(bos);
    free(eos);
    run_cases(argv[3]);
    run_glm5(argv[3]);
    run_builtin_and_errors();
#ifdef MLA_TOK_HAVE_GGUF
    if (argc >= 5) {
        gguf_ctx *g = NULL;
        REQUIRE(gguf_open(&g, argv[4], &err) == MLA_OK);
        tok_vocab *gv = NULL;
        REQUIRE(tok_vocab_from_gguf(&gv, g, &err) == MLA_OK);
        chat_tmpl *gt = NULL;
        REQUIRE(chat_tmpl_from_gguf(&gt, g, gv, &err) == MLA_OK);
        gguf_close(g);
        run_fixture(gv, gt, ref, "gguf");
        chat_tmpl_free(gt);
        tok_vocab_free(gv);
    }
#endif
    tok_vocab_free(v);
    cJSON_Delete(dump);
    cJSON_Delete(ref);
    return mla_test_finish();
}
