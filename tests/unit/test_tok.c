/* Tokenizer tests against the fixtures' HF reference ids.
 * usage: test_tok VOCAB_DUMP.json REF.json [MODEL.gguf]
 *        test_tok --encode VOCAB_DUMP.json < texts.json   (prints ids, for tests/tok/hf_compare.py)
 * VOCAB_DUMP.json is written by tests/tok/dump_vocab.py (gguf-py) from the fixture GGUF. With
 * MODEL.gguf (and our GGUF reader built), every check also runs on tok_vocab_from_gguf(). */
#include "unit/mla_test.h"

#include "tok/tok_fixture.h"
#ifdef MLA_TOK_HAVE_GGUF
#include "common/gguf.h"
#endif

static int ids_equal(const tok_ids *a, const cJSON *arr, size_t skip) {
    size_t n = (size_t)cJSON_GetArraySize(arr);
    if (n < skip || a->n != n - skip) return 0;
    for (size_t i = skip; i < n; i++)
        if (a->ids[i - skip] != (int32_t)cJSON_GetArrayItem(arr, (int)i)->valuedouble) return 0;
    return 1;
}

static void print_ids(const char *what, const tok_ids *a) {
    fprintf(stderr, "  %s:", what);
    for (size_t i = 0; i < a->n; i++) fprintf(stderr, " %d", a->ids[i]);
    fputc('\n', stderr);
}

/* decode(ids) == text, and the streaming decoder emits the same bytes, never a cut sequence */
static void check_decode(const tok_vocab *v, const int32_t *ids, size_t n, const char *text, size_t len) {
    size_t dl;
    char *d = tok_decode(v, ids, n, false, &dl);
    CHECKF(dl == len && memcmp(d, text, len) == 0, "decode differs for \"%.60s\" (%zu vs %zu bytes)", text, dl, len);
    size_t cap = tok_max_piece_len(v) + 64;
    char *buf = malloc(cap), *acc = malloc(dl + 64);
    size_t al = 0;
    tok_stream s;
    tok_stream_init(&s, v, false);
    int partial = 0;
    for (size_t i = 0; i < n; i++) {
        int k = tok_stream_feed(&s, ids[i], buf, cap);
        REQUIRE(k >= 0);
        if (!tf_utf8_valid(buf, (size_t)k)) partial = 1;
        if (al + (size_t)k <= dl) memcpy(acc + al, buf, (size_t)k);
        al += (size_t)k;
    }
    int k = tok_stream_finish(&s, buf, cap);
    REQUIRE(k >= 0);
    if (al + (size_t)k <= dl) memcpy(acc + al, buf, (size_t)k);
    al += (size_t)k;
    tok_stream_free(&s);
    if (tf_utf8_valid(text, len)) CHECKF(!partial, "stream emitted a partial UTF-8 sequence for \"%.60s\"", text);
    CHECKF(al == dl && memcmp(acc, d, dl) == 0, "stream != whole decode for \"%.60s\"", text);
    free(buf);
    free(acc);
    free(d);
}

static void run_ref(const tok_vocab *v, const cJSON *ref, const char *label) {
    mla_err err;
    const cJSON *it;
    /* tokenizer[]: text -> HF ids, no special tokens added. HF always splits added (special)
     * tokens out of the text, so parse_special is on. */
    int n_tok = 0;
    cJSON_ArrayForEach(it, cJSON_GetObjectItemCaseSensitive(ref, "tokenizer")) {
        const char *text = cJSON_GetObjectItemCaseSensitive(it, "text")->valuestring;
        const cJSON *ids = cJSON_GetObjectItemCaseSensitive(it, "ids");
        tok_ids out = {0};
        REQUIRE(tok_encode(v, text, strlen(text), false, true, &out, &err) == MLA_OK);
        int ok = ids_equal(&out, ids, 0);
        CHECKF(ok, "%s: tokenizer[] \"%s\"", label, text);
        if (!ok) print_ids("got", &out);
        check_decode(v, out.ids, out.n, text, strlen(text));
        tok_ids_free(&out);
        n_tok++;
    }
    CHECK(n_tok >= 5);
    /* prompts[]: the listed tokens start with the model's prompt prefix (BOS, or [gMASK]<sop>).
     * Chat prompts carry those specials literally in their text: the whole text tokenizes with
     * parse_special to the listed ids. Plain prompts do not: the ids after the leading control
     * tokens are the tokenization of the text. (test_chat checks the prefix itself against the
     * chat template.) */
    int n_chat = 0, n_plain = 0;
    cJSON_ArrayForEach(it, cJSON_GetObjectItemCaseSensitive(ref, "prompts")) {
        const char *text = cJSON_GetObjectItemCaseSensitive(it, "text")->valuestring;
        const cJSON *ids = cJSON_GetObjectItemCaseSensitive(it, "tokens");
        tok_ids out = {0};
        int32_t first = (int32_t)cJSON_GetArrayItem(ids, 0)->valuedouble;
        size_t fl;
        const char *ft = tok_token_text(v, first, &fl);
        REQUIRE(ft != NULL);
        if (strncmp(text, ft, fl) == 0) {
            REQUIRE(tok_encode(v, text, strlen(text), false, true, &out, &err) == MLA_OK);
            CHECKF(ids_equal(&out, ids, 0), "%s: chat prompt \"%s\"", label, text);
            n_chat++;
        } else {
            size_t lead = 0;
            while (lead < (size_t)cJSON_GetArraySize(ids) &&
                   tok_token_type(v, (int32_t)cJSON_GetArrayItem(ids, (int)lead)->valuedouble) == TOK_TYPE_CONTROL)
                lead++;
            CHECK(lead >= 1);
            CHECK(first == tok_bos(v)); /* BOS id from metadata starts every prompt */
            REQUIRE(tok_encode(v, text, strlen(text), false, true, &out, &err) == MLA_OK);
            int ok = ids_equal(&out, ids, lead);
            CHECKF(ok, "%s: prompt \"%.60s\"", label, text);
            if (!ok) print_ids("got", &out);
            n_plain++;
        }
        check_decode(v, out.ids, out.n, text, strlen(text));
        tok_ids_free(&out);
    }
    CHECK(n_chat >= 1 && n_plain >= 1);
}

static void run_roundtrip(const tok_vocab *v) {
    mla_err err;
    size_t N = 400;
    char *buf = malloc(4 * N + 1);
    for (int t = 0; t < 300; t++) {
        size_t len = tf_random_utf8(buf, 1 + tf_rand() % N);
        tok_ids out = {0};
        REQUIRE(tok_encode(v, buf, len, false, t & 1, &out, &err) == MLA_OK);
        check_decode(v, out.ids, out.n, buf, len);
        tok_ids_free(&out);
    }
    /* special token texts inside random text round-trip too */
    for (size_t id = 0; id < tok_n_tokens(v); id++) {
        if (tok_token_type(v, (int32_t)id) != TOK_TYPE_CONTROL) continue;
        size_t tl;
        const char *tt = tok_token_text(v, (int32_t)id, &tl);
        char text[512];
        int n = snprintf(text, sizeof text, "x %.*s\n%.*sy", (int)tl, tt, (int)tl, tt);
        tok_ids out = {0};
        REQUIRE(tok_encode(v, text, (size_t)n, false, true, &out, &err) == MLA_OK);
        CHECK(out.n >= 2);
        int found = 0;
        for (size_t i = 0; i < out.n; i++) found += out.ids[i] == (int32_t)id;
        CHECKF(found == 2, "special token %zu parsed %d times", id, found);
        check_decode(v, out.ids, out.n, text, (size_t)n);
        tok_ids_free(&out);
        /* without parse_special the text is plain text */
        REQUIRE(tok_encode(v, text, (size_t)n, false, false, &out, &err) == MLA_OK);
        found = 0;
        for (size_t i = 0; i < out.n; i++) found += out.ids[i] == (int32_t)id;
        CHECK(found == 0);
        check_decode(v, out.ids, out.n, text, (size_t)n);
        /* skip_special drops them */
        size_t dl;
        char *d = tok_decode(v, (int32_t[]){(int32_t)id}, 1, true, &dl);
        CHECK(dl == 0);
        free(d);
        tok_ids_free(&out);
    }
    /* invalid UTF-8 is tokenized as U+FFFD */
    {
        const char bad[] = "a\xff" "b\xe4\xb8";
        tok_ids a = {0}, b = {0};
        REQUIRE(tok_encode(v, bad, sizeof bad - 1, false, false, &a, &err) == MLA_OK);
        const char good[] = "a\xEF\xBF\xBD" "b\xEF\xBF\xBD\xEF\xBF\xBD";
        REQUIRE(tok_encode(v, good, sizeof good - 1, false, false, &b, &err) == MLA_OK);
        CHECK(a.n == b.n && memcmp(a.ids, b.ids, a.n * sizeof *a.ids) == 0);
        tok_ids_free(&a);
        tok_ids_free(&b);
    }
    /* the stream holds back a sequence split across tokens: feed a 4-byte emoji one byte token
     * at a time */
    {
        const char emo[] = "\xF0\x9F\x98\x80";
        tok_ids ids = {0};
        /* byte tokens: the single-char token of each byte in the GPT-2 alphabet */
        for (int i = 0; i < 4; i++) {
            unsigned char b = (unsigned char)emo[i];
            /* bytes 0x80..0xA0 and 0xAD map to 256+k; >= 0xAE map to themselves */
            unsigned cp;
            if (b >= 0xAE || (b >= 0xA1 && b <= 0xAC) || (b >= '!' && b <= '~')) cp = b;
            else {
                unsigned k = 0;
                for (unsigned x = 0; x < b; x++)
                    if (!((x >= 0xAE) || (x >= 0xA1 && x <= 0xAC) || (x >= '!' && x <= '~'))) k++;
                cp = 256 + k;
            }
            char u[4];
            size_t o = 0;
            tf_put_cp(u, &o, cp);
            int32_t id = tok_find(v, u, o);
            REQUIRE(id >= 0);
            tok_ids_push(&ids, id);
        }
        size_t cap = tok_max_piece_len(v) + 64;
        char *buf = malloc(cap);
        tok_stream s;
        tok_stream_init(&s, v, false);
        CHECK(tok_stream_feed(&s, ids.ids[0], buf, cap) == 0);
        CHECK(tok_stream_feed(&s, ids.ids[1], buf, cap) == 0);
        CHECK(tok_stream_feed(&s, ids.ids[2], buf, cap) == 0);
        int k = tok_stream_feed(&s, ids.ids[3], buf, cap);
        CHECK(k == 4 && memcmp(buf, emo, 4) == 0);
        /* an impossible continuation is flushed as is: F0 then 'a' */
        CHECK(tok_stream_feed(&s, ids.ids[0], buf, cap) == 0);
        int32_t a = tok_find(v, "a", 1);
        k = tok_stream_feed(&s, a, buf, cap);
        CHECK(k == 2 && (unsigned char)buf[0] == 0xF0 && buf[1] == 'a');
        CHECK(tok_stream_feed(&s, ids.ids[0], buf, cap) == 0);
        CHECK(tok_stream_finish(&s, buf, cap) == 1);
        tok_stream_free(&s);
        check_decode(v, ids.ids, ids.n, emo, 4);
        free(buf);
        tok_ids_free(&ids);
    }
    free(buf);
}

static void run_all(const tok_vocab *v, const cJSON *ref, const char *label) {
    run_ref(v, ref, label);
    run_roundtrip(v);
}

static int encode_mode(const char *dump) {
    cJSON *d = tf_read_json(dump);
    REQUIRE(d);
    mla_err err;
    tok_vocab *v = tf_vocab_from_dump(d, &err);
    REQUIRE(v);
    size_t cap = 1 << 20, n = 0;
    char *in = malloc(cap);
    size_t k;
    while ((k = fread(in + n, 1, cap - n, stdin)) > 0) {
        n += k;
        if (n == cap) in = realloc(in, cap *= 2);
    }
    in = realloc(in, n + 1);
    in[n] = 0;
    cJSON *texts = cJSON_Parse(in);
    REQUIRE(texts);
    cJSON *res = cJSON_CreateArray();
    const cJSON *it;
    cJSON_ArrayForEach(it, texts) {
        tok_ids out = {0};
        REQUIRE(tok_encode(v, it->valuestring, strlen(it->valuestring), false, true, &out, &err) == MLA_OK);
        cJSON *a = cJSON_CreateArray();
        for (size_t i = 0; i < out.n; i++) cJSON_AddItemToArray(a, cJSON_CreateNumber(out.ids[i]));
        cJSON_AddItemToArray(res, a);
        tok_ids_free(&out);
    }
    char *s = cJSON_PrintUnformatted(res);
    puts(s);
    free(s);
    cJSON_Delete(res);
    cJSON_Delete(texts);
    cJSON_Delete(d);
    free(in);
    tok_vocab_free(v);
    return 0;
}

int main(int argc, char **argv) {
    if (argc >= 3 && !strcmp(argv[1], "--encode")) return encode_mode(argv[2]);
    REQUIRE(argc >= 3);
    cJSON *dump = tf_read_json(argv[1]);
    cJSON *ref = tf_read_json(argv[2]);
    REQUIRE(dump && ref);
    mla_err err = {{0}};
    tok_vocab *v = tf_vocab_from_dump(dump, &err);
    if (!v) fprintf(stderr, "%s\n", err.msg);
    REQUIRE(v);
    run_all(v, ref, "dump");

    /* an unknown pre-tokenizer is refused, naming it */
    {
        tok_vocab_desc d;
        tok_vocab_desc_init(&d);
        const char *toks[] = {"a", "b"};
        d.n_tokens = 2;
        d.tokens = toks;
        d.pre = "qwen2";
        tok_vocab *x = NULL;
        CHECK(tok_vocab_from_arrays(&x, &d, &err) == MLA_ERR && x == NULL);
        CHECK(strstr(err.msg, "qwen2") != NULL);
    }
    /* add_bos: absent key -> no BOS (llama.cpp for these pre-tokenizers); present -> BOS */
    {
        tok_ids out = {0};
        REQUIRE(tok_encode(v, "hi", 2, true, false, &out, &err) == MLA_OK);
        CHECK(out.n >= 1 && out.ids[0] != tok_bos(v));
        tok_ids_free(&out);
        cJSON *d2 = cJSON_Duplicate(dump, 1);
        cJSON_AddItemToObject(d2, "tokenizer.ggml.add_bos_token", cJSON_CreateTrue());
        tok_vocab *v2 = tf_vocab_from_dump(d2, &err);
        REQUIRE(v2);
        REQUIRE(tok_encode(v2, "hi", 2, true, false, &out, &err) == MLA_OK);
        CHECK(out.n >= 2 && out.ids[0] == tok_bos(v2));
        tok_ids_free(&out);
        tok_vocab_free(v2);
        cJSON_Delete(d2);
    }
    CHECK(tok_is_eog(v, tok_eos(v)));
    tok_vocab_free(v);

#ifdef MLA_TOK_HAVE_GGUF
    if (argc >= 4) {
        gguf_ctx *g = NULL;
        int rc = gguf_open(&g, argv[3], &err);
        if (rc != MLA_OK) fprintf(stderr, "gguf_open: %s\n", err.msg);
        REQUIRE(rc == MLA_OK);
        tok_vocab *gv = NULL;
        rc = tok_vocab_from_gguf(&gv, g, &err);
        if (rc != MLA_OK) fprintf(stderr, "tok_vocab_from_gguf: %s\n", err.msg);
        REQUIRE(rc == MLA_OK);
        gguf_close(g); /* the vocab owns copies */
        run_all(gv, ref, "gguf");
        tok_vocab_free(gv);
    }
#endif
    cJSON_Delete(dump);
    cJSON_Delete(ref);
    return mla_test_finish();
}
