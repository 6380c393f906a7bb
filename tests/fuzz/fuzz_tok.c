/* libFuzzer target: tokenizer encode / decode / streaming decode of arbitrary bytes.
 * The vocabulary is synthetic (all 256 byte-level symbols, a few merges, special tokens), so
 * the target needs no files. Checks: no crash / leak / UB; valid UTF-8 round-trips exactly;
 * the streaming decoder emits the same bytes as whole decode, and only whole sequences when
 * the text was valid. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coordinator/tok.h"

static tok_vocab *vocabs[2];

static void put_cp(char *b, size_t *o, unsigned cp) {
    if (cp < 0x80) b[(*o)++] = (char)cp;
    else {
        b[(*o)++] = (char)(0xC0 | (cp >> 6));
        b[(*o)++] = (char)(0x80 | (cp & 0x3F));
    }
}

static tok_vocab *make_vocab(const char *pre) {
    static char store[256][4];
    static const char *extra[] = {"Ġt", "he", "Ġthe", "in", "Ġa", "ĠĠ", "ĠĠĠĠ", "Ċ", "ĊĊ", "12", "123",
                                  "<|user|>", "<|assistant|>", "[gMASK]", "<sop>", "<｜User｜>", "<x>"};
    static const char *merges[] = {"Ġ t", "h e", "Ġt he", "i n", "Ġ a", "Ġ Ġ", "ĠĠ ĠĠ", "Ċ Ċ", "1 2", "12 3"};
    const char *toks[256 + 32];
    int32_t types[256 + 32];
    size_t n = 0;
    int k = 0;
    for (int b = 0; b < 256; b++) {
        bool keep = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
        unsigned cp = keep ? (unsigned)b : (unsigned)(256 + k++);
        size_t o = 0;
        put_cp(store[b], &o, cp);
        store[b][o] = 0;
        toks[n] = store[b];
        types[n++] = TOK_TYPE_NORMAL;
    }
    for (size_t i = 0; i < sizeof extra / sizeof *extra; i++) {
        toks[n] = extra[i];
        types[n++] = extra[i][0] == '<' || extra[i][0] == '[' ? (i % 2 ? TOK_TYPE_CONTROL : TOK_TYPE_USER_DEFINED)
                                                              : TOK_TYPE_NORMAL;
    }
    tok_vocab_desc d;
    tok_vocab_desc_init(&d);
    d.n_tokens = n;
    d.tokens = toks;
    d.token_types = types;
    d.n_merges = sizeof merges / sizeof *merges;
    d.merges = merges;
    d.pre = pre;
    d.bos = 256 + 13;
    d.eos = 256 + 11;
    mla_err err;
    tok_vocab *v = NULL;
    if (tok_vocab_from_arrays(&v, &d, &err) != MLA_OK) {
        fprintf(stderr, "%s\n", err.msg);
        abort();
    }
    return v;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!vocabs[0]) {
        vocabs[0] = make_vocab("deepseek-v3");
        vocabs[1] = make_vocab("glm4");
    }
    if (size < 1) return 0;
    const tok_vocab *v = vocabs[data[0] & 1];
    bool parse_special = data[0] & 2, add_special = data[0] & 4;
    const char *text = (const char *)data + 1;
    size_t len = size - 1;
    tok_ids ids = {0};
    mla_err err;
    if (tok_encode(v, text, len, add_special, parse_special, &ids, &err) != MLA_OK) abort();
    size_t dl;
    char *d = tok_decode(v, ids.ids, ids.n, false, &dl);
    bool valid = true;
    for (size_t i = 0; i < len;) {
        int l = tok_utf8_seq_len((const unsigned char *)text + i, len - i);
        if (!l) {
            valid = false;
            break;
        }
        i += (size_t)l;
    }
    if (valid && !add_special && (dl != len || memcmp(d, text, len) != 0)) abort();
    /* streaming */
    size_t cap = tok_max_piece_len(v) + 64, al = 0;
    char *buf = malloc(cap), *acc = malloc(dl + 8);
    tok_stream s;
    tok_stream_init(&s, v, false);
    for (size_t i = 0; i < ids.n; i++) {
        int k = tok_stream_feed(&s, ids.ids[i], buf, cap);
        if (k < 0 || al + (size_t)k > dl) abort();
        if (valid)
            for (int j = 0; j < k;) {
                int l = tok_utf8_seq_len((unsigned char *)buf + j, (size_t)(k - j));
                if (!l) abort();
                j += l;
            }
        memcpy(acc + al, buf, (size_t)k);
        al += (size_t)k;
    }
    int k = tok_stream_finish(&s, buf, cap);
    if (k < 0 || al + (size_t)k != dl) abort();
    memcpy(acc + al, buf, (size_t)k);
    if (memcmp(acc, d, dl) != 0) abort();
    tok_stream_free(&s);
    /* skip_special decode never grows */
    size_t sl;
    char *ds = tok_decode(v, ids.ids, ids.n, true, &sl);
    if (sl > dl) abort();
    free(ds);
    free(buf);
    free(acc);
    free(d);
    tok_ids_free(&ids);
    return 0;
}
