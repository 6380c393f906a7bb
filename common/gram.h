/* gram: grammars in llama.cpp's GBNF syntax, their pushdown automaton, and token masks.
 *
 * GBNF: `name ::= alternatives` rules (names [A-Za-z0-9_-]+), the start rule is `root`;
 * alternatives `a | b`, sequences, "strings" (escapes \n \r \t \\ \" \' \[ \] \xHH \uHHHH
 * \UHHHHHHHH), character classes [a-z0-9_] and [^...], `.` (any character), groups ( ... ),
 * postfix * + ? {m} {m,} {m,n}; `#` comments. Line breaks carry no meaning (a rule ends where the
 * next `name ::=` starts). Characters are Unicode code points; the matcher advances byte by byte
 * over UTF-8. Tokens, as llama.cpp's GBNF has them: <[id]> is the one token id, !<[id]> any one
 * token but id (text or special); they take a whole token, never a byte (token text as <text> is
 * not supported). An end-of-sequence token is taken only where the grammar is complete, never by
 * a token element.
 *
 * The automaton: a state is a set of stacks of positions in the rules (hash-consed nodes: two
 * equal stacks are one node id) plus an incomplete UTF-8 sequence. Bounds, each an error that
 * names it rather than unbounded work: GRAM_MAX_TEXT bytes of grammar, GRAM_MAX_RULES rules,
 * GRAM_MAX_ELEMS elements, GRAM_MAX_REPEAT for {m,n}, GRAM_MAX_NEST nested groups; left
 * recursion (a rule that can reach itself without consuming input) is refused at parse time;
 * GRAM_MAX_STACKS stacks per state (ambiguity), GRAM_MAX_DEPTH stack depth (nesting),
 * GRAM_MAX_NODES stack nodes per matcher, GRAM_MAX_EMPTY_RUN references in a row that match the
 * empty string.
 *
 * Token masks: gram_vocab holds a trie of the vocabulary's token bytes (special tokens, which
 * only token elements take, left out); gram_match_mask walks it with the automaton so that shared prefixes are checked once, each
 * (state, byte) transition computed once per mask, and keeps the masks of its last GRAM_MASK_CACHE
 * states: a state met again (inside a string, between array items) costs a copy.
 *
 * Ownership: gram_parse -> gram_free (immutable afterwards, may be shared by matchers that do
 * not outlive it); gram_vocab_new -> gram_vocab_free; gram_match_new -> gram_match_free. A
 * matcher is used by one thread at a time. */
#ifndef GRAM_H
#define GRAM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "mla_err.h"

#define GRAM_MAX_TEXT (1u << 20)
#define GRAM_MAX_RULES 16384
#define GRAM_MAX_ELEMS (1u << 20)
#define GRAM_MAX_REPEAT 1000
#define GRAM_MAX_NEST 100
#define GRAM_MAX_STACKS 1024
#define GRAM_MAX_DEPTH 2048
#define GRAM_MAX_NODES (1u << 22)
#define GRAM_MAX_EMPTY_RUN 2000
#define GRAM_MASK_CACHE 8 /* masks a matcher keeps for states met again */
#define GRAM_MAX_TOKEN 2147483647u /* the largest id <[id]> may name */

typedef struct gram gram;
typedef struct gram_vocab gram_vocab;
typedef struct gram_match gram_match;

/* Parses GBNF text (len bytes, need not be NUL-terminated). Errors name the line and column. */
int gram_parse(gram **out, const char *text, size_t len, mla_err *err);
/* What a server checks when a request brings a grammar: it parses, its start state can be
 * built within the matcher's bounds (gram_match_new: a long run of rules that each begin with the
 * next is refused there), so that a worker can set it up, and it matches some text: the empty
 * text, or a first byte that the matcher takes within its bounds (the masks of the first step
 * try every byte). */
int gram_check(const char *text, size_t len, mla_err *err);
/* The same, and *max_token the largest token id it names (gram_max_token); with taken (NULL: not
 * wanted), the ids its <[id]> elements name into *taken (malloc'd, the caller frees it; NULL when
 * none), *n_taken of them: a server refuses a grammar whose <[id]> names an end-of-generation
 * token, which token elements never take. */
int gram_check_tokens(const char *text, size_t len, int64_t *max_token, uint32_t **taken, size_t *n_taken,
                      mla_err *err);
void gram_free(gram *g);
uint32_t gram_n_rules(const gram *g);
/* The largest token id the grammar's token elements name; -1 when it has none (a server checks it
 * against its vocabulary). */
int64_t gram_max_token(const gram *g);

/* A vocabulary of n_vocab tokens, all absent until set. */
gram_vocab *gram_vocab_new(uint32_t n_vocab);
/* Token id's bytes; a token never set (or set with len 0) is never allowed. */
void gram_vocab_set(gram_vocab *v, uint32_t id, const uint8_t *bytes, size_t len);
/* Marks id an end-of-sequence token: allowed exactly when the grammar is complete. */
void gram_vocab_set_eos(gram_vocab *v, uint32_t id);
/* Marks id (one without bytes) a special token: taken only by token elements (<[id]>, !<[id]>). */
void gram_vocab_set_special(gram_vocab *v, uint32_t id);
uint32_t gram_vocab_n(const gram_vocab *v);
bool gram_vocab_is_eos(const gram_vocab *v, uint32_t id);
/* The bytes of token id (NULL, 0 when absent). */
const uint8_t *gram_vocab_bytes(const gram_vocab *v, uint32_t id, size_t *len);
void gram_vocab_free(gram_vocab *v);

/* GPT-2 byte-level BPE: the byte a code point of a token's text stands for, -1 when none. */
int gram_gpt2_byte(uint32_t cp);

/* The start state of g (expanded from `root`). */
int gram_match_new(gram_match **out, const gram *g, mla_err *err);
void gram_match_free(gram_match *m);
/* Advances by bytes; on failure (bytes not accepted, a bound hit) the state is unchanged. */
int gram_match_accept(gram_match *m, const uint8_t *bytes, size_t len, mla_err *err);
/* Whether bytes would be accepted (the state is unchanged). MLA_ERR only on a bound. */
int gram_match_try(gram_match *m, const uint8_t *bytes, size_t len, bool *ok, mla_err *err);
/* Advances by token id of v: its bytes through the character elements and the token through the
 * token elements, either way (both: the union). On failure the state is unchanged. */
int gram_match_accept_token(gram_match *m, const gram_vocab *v, uint32_t id, mla_err *err);
/* Whether token id would be accepted (the state is unchanged). MLA_ERR only on a bound. */
int gram_match_try_token(gram_match *m, const gram_vocab *v, uint32_t id, bool *ok, mla_err *err);
/* The input so far is a complete sentence of the grammar (end of sequence allowed). */
bool gram_match_complete(const gram_match *m);
/* (v's flat trie is built at its first mask; a later gram_vocab_set drops it.)
 * allow[i] = 1 for each token of v that the automaton accepts from the current state
 * (gram_match_try_token), end of sequence tokens when complete, else 0 (allow has gram_vocab_n(v) entries). Returns the count
 * allowed, or -1 with err set on a bound. */
int64_t gram_match_mask(gram_match *m, gram_vocab *v, uint8_t *allow, mla_err *err);
/* Builds v's token trie now (the first gram_match_mask does it otherwise): after this, masks of
 * different matchers over v may run on several threads at once. */
void gram_vocab_freeze(gram_vocab *v);

#endif
