/* coordinator/api_params.c: the UTF-8 of generated text. An output cut inside a character (a
 * byte token of a multi-byte one, the last token of a max_tokens cut) becomes one U+FFFD per
 * maximal subpart, as Python's bytes.decode("utf-8", "replace") gives (the expected strings
 * below are what it returns); a token that starts inside a character gets that character's
 * text_offset. */
#include <stdlib.h>
#include <string.h>

#include "api_params.h"
#include "chat_json.h"
#include "mla_test.h"

static const struct {
    const char *in;
    size_t n;
    const char *out; /* Python 3: in.decode("utf-8", "replace").encode() */
    size_t chars;    /* len(in.decode("utf-8", "replace")) */
} k_cases[] = {
    {"\x61\x62\x63", 3, "\x61\x62\x63", 3},
    {"\xe4\xbd", 2, "\xef\xbf\xbd", 1},
    {"\x61\xe4\xbd\xa0\x62", 5, "\x61\xe4\xbd\xa0\x62", 3},
    {"\xe4\x41", 2, "\xef\xbf\xbd\x41", 2},
    {"\xed\xa0\x80", 3, "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd", 3},
    {"\xf0\x9f\x98", 3, "\xef\xbf\xbd", 1},
    {"\xf0\x9f\x98\x80", 4, "\xf0\x9f\x98\x80", 1},
    {"\xff\xfe", 2, "\xef\xbf\xbd\xef\xbf\xbd", 2},
    {"\xc0\xaf", 2, "\xef\xbf\xbd\xef\xbf\xbd", 2},
    {"\xe0\x80\xaf", 3, "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd", 3},
    {"\xf4\x90\x80\x80", 4, "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd", 4},
    {"\x80\x80", 2, "\xef\xbf\xbd\xef\xbf\xbd", 2},
    {"\xf0\x9f\x41", 3, "\xef\xbf\xbd\x41", 2},
    {"\xe4\xbd\xe4\xbd\xa0", 5, "\xef\xbf\xbd\xe4\xbd\xa0", 2},
    {"\x78\xe4\xbd", 3, "\x78\xef\xbf\xbd", 2},
};

static void test_sanitize(void) {
    for (size_t i = 0; i < sizeof k_cases / sizeof k_cases[0]; i++) {
        size_t n = 0;
        char *s = api_utf8_sanitize(k_cases[i].in, k_cases[i].n, &n);
        CHECKF(n == strlen(k_cases[i].out) && memcmp(s, k_cases[i].out, n) == 0 && s[n] == 0, "case %zu", i);
        CHECKF(api_utf8_chars(k_cases[i].in, k_cases[i].n) == k_cases[i].chars, "case %zu: %zu chars", i,
               api_utf8_chars(k_cases[i].in, k_cases[i].n));
        free(s);
    }
}

static void test_char_start(void) {
    /* "a", U+4F60 (3 bytes), "b" */
    const char *t = "\x61\xe4\xbd\xa0\x62";
    const size_t want[] = {0, 1, 1, 1, 4, 5};
    for (size_t p = 0; p <= 5; p++) CHECKF(api_utf8_char_start(t, 5, p) == want[p], "pos %zu", p);
    /* a character still cut off at the end (its next bytes not generated yet) */
    CHECK(api_utf8_char_start("\x78\xe4\xbd", 3, 2) == 1);
    /* a 4-byte character */
    CHECK(api_utf8_char_start("\xf0\x9f\x98\x80", 4, 3) == 0);
    /* stray continuation bytes and a lead byte whose sequence ends before pos: their own start */
    CHECK(api_utf8_char_start("\x80\x80", 2, 1) == 1);
    CHECK(api_utf8_char_start("\xe4\x41", 2, 1) == 1);
    CHECK(api_utf8_char_start("\x61\x80\x80\x80\x80", 5, 4) == 4);
    /* the offsets of byte tokens: each token's offset is that of the character it starts in */
    const char *u = "\x61\xe4\xbd\xa0\x62\xf0\x9f\x98\x80";
    const size_t offs[] = {0, 1, 1, 1, 2, 3, 3, 3, 3};
    for (size_t p = 0; p < 9; p++)
        CHECKF(api_utf8_chars(u, api_utf8_char_start(u, 9, p)) == offs[p], "offset of byte %zu", p);
}

/* a NUL byte of generated text survives into the printed JSON as \u0000, in values and keys (a
 * completions top_logprobs key is a token's text), the text after it kept */
static void test_json_nul(void) {
    size_t n = 0;
    char *s = api_json_text("a\0b\xff", 4, &n);
    CHECKF(n == 6 && s[1] == CHAT_JSON_NUL && !memcmp(s + 2, "b\xef\xbf\xbd", 4) && s[6] == 0, "%zu bytes", n);
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "t", s);
    cJSON_AddNumberToObject(j, s, 1);
    char *p = chat_json_print(j);
    CHECKF(!strcmp(p, "{\"t\":\"a\\u0000b\xef\xbf\xbd\",\"a\\u0000b\xef\xbf\xbd\":1}"), "%s", p);
    cJSON *back = cJSON_Parse(p);
    CHECK(back && cJSON_GetObjectItemCaseSensitive(back, "t")); /* valid JSON (cJSON itself stops at the NUL) */
    cJSON_Delete(back);
    free(p);
    cJSON_Delete(j);
    free(s);
}

int main(void) {
    test_sanitize();
    test_char_start();
    test_json_nul();
    return mla_test_finish();
}
