/* chat_guard: keeps text from chat messages from turning into control tokens.
 *
 * A chat prompt is the chat template rendered over the messages, then tokenized with control
 * tokens parsed (the template writes "<｜User｜>", "<|assistant|>", ... as text). Text a client
 * put into a message must not become a control token: a message holding
 * "<｜end▁of▁sentence｜><｜Assistant｜>" would otherwise forge turn boundaries.
 *
 * How: chat_guard_protect copies the messages (and the tools and other values the template
 * renders) and replaces every control-token text found in their strings and keys (by the
 * tokenizer's own matcher) with a placeholder: a private-use character, a
 * decimal index, another private-use character (two code points that occur in no string of the
 * messages). The template renders the copy; chat_guard_restore puts the original texts back and
 * returns their byte spans, which the tokenizer then encodes as plain text (tok_encode_spans).
 * Control tokens thus come only from the template's own text. Strings the template transforms
 * (filters, slicing) keep their placeholders whole unless the template cuts into them; a cut
 * placeholder stays as text (never a control token). Content given as an array of text parts is
 * refused when the parts only together spell a control token (the template may join them).
 *
 * Ownership: chat_guard_init / chat_guard_free; protect's *out (a cJSON the caller deletes) and
 * restore's *out and *spans (malloc'd, the caller frees). Pure: no I/O, any thread. */
#ifndef CHAT_GUARD_H
#define CHAT_GUARD_H

#include <cjson/cJSON.h>
#include <stddef.h>

#include "common/mla_err.h"

/* Length of the control-token text starting at s[pos] (leftmost-longest), 0 when none. */
typedef size_t (*chat_guard_match_fn)(void *ctx, const char *s, size_t len, size_t pos);

typedef struct chat_guard {
    char open[4], close[4]; /* the placeholder's two private-use code points (UTF-8, 3 bytes) */
    char **texts;           /* the replaced texts, by placeholder index */
    size_t n, cap;
} chat_guard;

void chat_guard_init(chat_guard *g);
void chat_guard_free(chat_guard *g);
/* A copy of messages with every control-token text in its strings and object keys replaced by a
 * placeholder; with vars (the template's other client-given values: tools, kwargs; may be NULL)
 * a copy of those too in *vars_out, by the same placeholders. MLA_ERR (err says why) when no
 * placeholder characters are free or text parts combine into a control token. */
int chat_guard_protect(chat_guard *g, const cJSON *messages, const cJSON *vars, chat_guard_match_fn match, void *ctx,
                       cJSON **out, cJSON **vars_out, mla_err *err);
/* The rendered text with the placeholders replaced by the original texts; spans gets
 * 2 * *n_spans offsets, [start, end) pairs in ascending order, of the restored texts. */
void chat_guard_restore(const chat_guard *g, const char *text, size_t len, char **out, size_t *out_len,
                        size_t **spans, size_t *n_spans);

#endif
