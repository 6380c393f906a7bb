/* chat_reasoning: splits a chat completion's text into reasoning_content and content.
 *
 * Every supported family writes its reasoning between "<think>" and "</think>" (DeepSeek-R1,
 * DeepSeek-V3.1 in thinking mode, GLM-4.5/4.6/4.7/5, Kimi-K2-Thinking; docs/chat-dialects.md).
 * Kimi-K2 may also end it by opening its tool-call section without "</think>": for that kind the
 * section's first marker ends the reasoning too and starts the content (where the tool-call
 * parser finds it). The reasoning is open from the first output byte when the prompt itself ends
 * with "<think>" (R1's and GLM-5's templates write it in the generation prompt; V3.1 with
 * thinking on), and a "<think>" that the model writes again there (after whitespace) is dropped;
 * otherwise only an output that starts (after whitespace) with "<think>" has reasoning. After a
 * prompt ending in "</think>" or "<think></think>" (the thinking switch off) all of the output is
 * content, a "<think>" at its start included (reasoning_prompt_state: the caller does not split):
 * nothing is eaten, as vLLM's parsers take it with thinking off.
 *
 * The split is a pure function of the whole text so far, so streaming recomputes it on every
 * flush and sends what grew. A partial split (final = false) holds back text that may still
 * change: a suffix that could be the start of "<think>" / "</think>", and whitespace that the
 * final split trims (reasoning is trimmed at both ends, content at its start after "</think>").
 * Each partial span is a prefix of the final one.
 *
 * Ownership: no allocation; spans are byte offsets into the caller's text. Any thread. */
#ifndef CHAT_REASONING_H
#define CHAT_REASONING_H

#include <stdbool.h>
#include <stddef.h>

enum reasoning_kind {
    REASONING_NONE = 0,
    REASONING_DEEPSEEK_R1,
    REASONING_DEEPSEEK_V31,
    REASONING_GLM,
    REASONING_KIMI_K2,
};
#define REASONING_AUTO (-1)
#define REASONING_OPEN_TAG "<think>"
#define REASONING_CLOSE_TAG "</think>" /* where every supported family's reasoning ends */

/* "none", "deepseek-r1", "deepseek-v3.1", "glm", "kimi-k2" */
const char *reasoning_kind_name(enum reasoning_kind k);
/* The names above and "auto" (REASONING_AUTO); -2 when unknown. */
int reasoning_kind_parse(const char *name);
/* The kind a chat template calls for (NULL or no "</think>" in it: REASONING_NONE). */
enum reasoning_kind reasoning_auto(const char *template_src);
/* Where the rendered prompt leaves the reasoning (trailing whitespace aside): ending with
 * "<think>", open (the output starts inside it); ending with "</think>" (the thinking switch off,
 * "<think></think>" included), closed: all of the output is content, whatever it starts with, and
 * the caller splits nothing; else free: an output that starts with "<think>" opens it. */
enum reasoning_prompt { REASONING_PROMPT_FREE = 0, REASONING_PROMPT_OPEN, REASONING_PROMPT_CLOSED };
enum reasoning_prompt reasoning_prompt_state(const char *prompt, size_t len);
/* Whether text s[0, len) leaves a reasoning open: its last "<think>" after its last "</think>"
 * (an assistant message continued from inside its thinking: continue_final_message). */
bool reasoning_text_open(const char *s, size_t len);

typedef struct reasoning_split {
    size_t r_start, r_end; /* reasoning: text[r_start, r_end) (empty when r_end <= r_start) */
    size_t c_start, c_end; /* content: text[c_start, c_end) */
    bool has_reasoning;    /* a reasoning block was opened */
} reasoning_split;

/* scan (NULL: none): where the search for the reasoning's end may start, kept by a caller that
 * parses one growing text again and again (a stream), 0 at first: the search then reads each byte
 * about once over the stream, not once a parse. The split is the same with or without it. */
void reasoning_split_text(enum reasoning_kind kind, const char *text, size_t len, bool starts_inside, bool final,
                          size_t *scan, reasoning_split *out);

#endif
