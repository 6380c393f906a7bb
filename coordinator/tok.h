/* tok: the byte-level BPE tokenizer of a GGUF vocabulary (tokenizer.ggml.model = "gpt2").
 *
 * What it implements (and where each fact comes from):
 * - Vocabulary: tokenizer.ggml.tokens (token text; NORMAL tokens are stored in the GPT-2
 *   byte-to-unicode alphabet, CONTROL / USER_DEFINED tokens as their raw text),
 *   tokenizer.ggml.token_type (1 NORMAL, 2 UNKNOWN, 3 CONTROL, 4 USER_DEFINED, 5 UNUSED, 6 BYTE),
 *   tokenizer.ggml.merges ("left right", rank = index).
 * - Special tokens are matched in the raw text before pre-tokenization, leftmost-longest
 *   (HF tokenizers' added-token matcher). USER_DEFINED tokens are always matched; CONTROL
 *   tokens only when parse_special is set (llama.cpp: tokenizer_st_partition).
 * - Pre-tokenizers by tokenizer.ggml.pre: "deepseek-v3" (DeepSeek-V3/R1), "deepseek-llm"
 *   (DeepSeek-V2/V2-Lite), "kimi-k2", "glm4" (GLM-4.5 .. GLM-5), "gpt-2"/"gpt2", "default"
 *   (regexes and their sources in tok_bpe.c). Any other value is refused with an error naming it.
 * - add_bos / add_eos: tokenizer.ggml.add_bos_token / add_eos_token when present; when absent,
 *   false for every pre-tokenizer supported here (llama.cpp llama-vocab.cpp: add_bos defaults
 *   to false and only the llama3/tekken/chameleon pre-tokenizers turn it on).
 * - Text that is not valid UTF-8 is tokenized as if each invalid byte were U+FFFD.
 *
 * Ownership: tok_vocab_* constructors return a vocab the caller frees with tok_vocab_free();
 * it copies everything it needs (the gguf_ctx may be closed afterwards). Returned token text
 * pointers stay valid until tok_vocab_free(). A vocab is read-only after construction and may be
 * used from several threads at once. A tok_stream is owned by its caller (init/free pair) and
 * borrows the vocab.
 */
#ifndef TOK_H
#define TOK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/gguf.h"
#include "common/mla_err.h"

enum tok_type {
    TOK_TYPE_UNDEFINED = 0,
    TOK_TYPE_NORMAL = 1,
    TOK_TYPE_UNKNOWN = 2,
    TOK_TYPE_CONTROL = 3,
    TOK_TYPE_USER_DEFINED = 4,
    TOK_TYPE_UNUSED = 5,
    TOK_TYPE_BYTE = 6,
};

enum tok_pre {
    TOK_PRE_DEFAULT = 0, /* llama.cpp's LLAMA_VOCAB_PRE_TYPE_DEFAULT */
    TOK_PRE_GPT2,
    TOK_PRE_DEEPSEEK3,
    TOK_PRE_GLM4,
    TOK_PRE_DEEPSEEK_LLM,
    TOK_PRE_KIMI_K2,
};

typedef struct tok_vocab tok_vocab;

/* Everything the array constructor needs; strings are NUL-terminated or carry a length. */
typedef struct tok_vocab_desc {
    size_t n_tokens;
    const char *const *tokens;   /* n_tokens strings */
    const size_t *token_lens;    /* NULL: strlen() of each */
    const int32_t *token_types;  /* NULL: all NORMAL */
    size_t n_merges;
    const char *const *merges;   /* "left right" */
    const size_t *merge_lens;    /* NULL: strlen() */
    const char *pre;             /* tokenizer.ggml.pre; NULL means "default" */
    int32_t bos, eos, eot, eom, unk, pad; /* -1 when absent */
    int add_bos, add_eos;        /* 1 / 0, or -1 for "absent: follow llama.cpp" */
} tok_vocab_desc;

/* A desc with every id -1 and add_bos/add_eos -1. */
void tok_vocab_desc_init(tok_vocab_desc *d);

int tok_vocab_from_arrays(tok_vocab **out, const tok_vocab_desc *d, mla_err *err);
/* Reads tokenizer.ggml.* from a GGUF file. */
int tok_vocab_from_gguf(tok_vocab **out, const gguf_ctx *g, mla_err *err);
void tok_vocab_free(tok_vocab *v);

size_t tok_n_tokens(const tok_vocab *v);
enum tok_pre tok_pre_type(const tok_vocab *v);
const char *tok_pre_name(const tok_vocab *v);
int32_t tok_bos(const tok_vocab *v);
int32_t tok_eos(const tok_vocab *v);
int32_t tok_eot(const tok_vocab *v);
int32_t tok_eom(const tok_vocab *v);
int32_t tok_unk(const tok_vocab *v);
int32_t tok_pad(const tok_vocab *v);
bool tok_add_bos(const tok_vocab *v);
bool tok_add_eos(const tok_vocab *v);
/* End of generation: eos, eot, eom, and the tokens llama.cpp treats as such by their text. */
bool tok_is_eog(const tok_vocab *v, int32_t id);
/* -1 when id is out of range. */
int tok_token_type(const tok_vocab *v, int32_t id);
/* The stored text of a token (byte-level alphabet for NORMAL tokens); NULL when out of range. */
const char *tok_token_text(const tok_vocab *v, int32_t id, size_t *len);
/* The bytes a token decodes to; NULL when out of range. */
const char *tok_token_piece(const tok_vocab *v, int32_t id, size_t *len);
/* Token id of an exact stored text, or -1. */
int32_t tok_find(const tok_vocab *v, const char *text, size_t len);

/* A growable array of token ids owned by the caller (free with tok_ids_free). */
typedef struct tok_ids {
    int32_t *ids;
    size_t n, cap;
} tok_ids;
void tok_ids_push(tok_ids *t, int32_t id);
void tok_ids_free(tok_ids *t);

/* Appends the tokens of text[0..len) to out. add_special: BOS/EOS per the vocab's add_bos /
 * add_eos. parse_special: CONTROL token texts in the input become those tokens (otherwise they
 * are tokenized as plain text). Returns MLA_OK, or MLA_ERR (only for internal regex failures). */
int tok_encode(const tok_vocab *v, const char *text, size_t len, bool add_special,
               bool parse_special, tok_ids *out, mla_err *err);

/* As tok_encode, and CONTROL tokens are never matched where they would touch one of the
 * n_plain spans plain[2k] .. plain[2k+1] (byte offsets into text, ascending, not overlapping):
 * text there is tokenized as plain text (chat messages, coordinator/chat_guard.h). */
int tok_encode_spans(const tok_vocab *v, const char *text, size_t len, bool add_special, bool parse_special,
                     const size_t *plain, size_t n_plain, tok_ids *out, mla_err *err);
/* Length of the CONTROL token text that tok_encode would match at text[pos] with parse_special
 * (leftmost-longest among the special tokens), 0 when none. */
size_t tok_control_at(const tok_vocab *v, const char *text, size_t len, size_t pos);

/* Whole-sequence detokenization into a NUL-terminated malloc'd string (the caller frees it);
 * *out_len gets its length. skip_special: CONTROL tokens render as nothing. Ids out of range
 * render as nothing. */
char *tok_decode(const tok_vocab *v, const int32_t *ids, size_t n, bool skip_special,
                 size_t *out_len);

/* Streaming detokenizer: fed token ids, emits only complete UTF-8 sequences; bytes of a
 * sequence split across tokens are held back until complete. Bytes that can never complete a
 * sequence (invalid UTF-8) are passed through as they are, so that the concatenation of
 * everything emitted (including tok_stream_finish) equals tok_decode() of the same ids. */
typedef struct tok_stream {
    const tok_vocab *v;
    bool skip_special;
    unsigned char held[4];
    int n_held;
} tok_stream;
void tok_stream_init(tok_stream *s, const tok_vocab *v, bool skip_special);
/* Writes at most cap bytes (cap >= 64 + longest token piece is always enough; see
 * tok_max_piece_len) into buf and returns the count, or -1 when cap is too small. */
int tok_stream_feed(tok_stream *s, int32_t id, char *buf, size_t cap);
/* Flushes the held bytes (an incomplete sequence at the end of the stream). */
int tok_stream_finish(tok_stream *s, char *buf, size_t cap);
void tok_stream_free(tok_stream *s);
size_t tok_max_piece_len(const tok_vocab *v);

/* UTF-8 helpers shared with the chat module and tests. Length of the complete, valid UTF-8
 * sequence starting at s (1..4), or 0 when the bytes there are not one (invalid or cut off). */
int tok_utf8_seq_len(const unsigned char *s, size_t avail);

#endif
