/* chat: turns a conversation into prompt text with the model's chat template.
 *
 * The template is the Jinja text in tokenizer.chat_template, rendered by chat_jinja with the
 * variables Hugging Face's apply_chat_template passes: messages, add_generation_prompt,
 * bos_token, eos_token (plus any extra variables the caller gives). When the GGUF carries no
 * template, or its template uses a Jinja feature chat_jinja does not implement
 * (JINJA_E_UNSUPPORTED, found when the template is loaded, with a warning), a built-in template
 * of the model family is used instead:
 *   deepseek3: {bos}{system...}<｜User｜>{u}<｜Assistant｜>{a}<｜end▁of▁sentence｜>...<｜Assistant｜>
 *              (DeepSeek-V3's tokenizer_config.json chat_template, tools left out)
 *   glm:       [gMASK]<sop><|system|>{s}<|user|>{u}<|assistant|></think>{a}...<|assistant|><think>
 *              (GLM-5's format as documented by its tokenizer: thinking turned on)
 * chat_tmpl_used() says which one rendered (for `inspect` and logs).
 *
 * Ownership: chat_tmpl_* objects are owned by the caller (new/free pair) and copy what they
 * need; rendered strings are malloc'd and freed by the caller. A chat_tmpl is read-only after
 * construction and may be used from several threads at once.
 */
#ifndef CHAT_H
#define CHAT_H

#include <cjson/cJSON.h>
#include <stdbool.h>
#include <stddef.h>

#include "common/gguf.h"
#include "common/mla_err.h"
#include "tok.h"

typedef struct chat_msg {
    const char *role;    /* "system", "user", "assistant", "tool" */
    const char *content; /* UTF-8, NUL-terminated */
} chat_msg;

enum chat_family { CHAT_FAMILY_NONE = 0, CHAT_FAMILY_DEEPSEEK3, CHAT_FAMILY_GLM };

const char *chat_family_name(enum chat_family f);
/* From general.architecture and tokenizer.ggml.pre (either may be NULL). */
enum chat_family chat_family_guess(const char *arch, const char *pre);

/* Renders the Jinja template tmpl directly (no fallback). Returns MLA_OK or a negative
 * jinja_status (see chat_jinja.h) with err filled. */
int chat_render(const char *tmpl, const chat_msg *msgs, size_t n, bool add_generation_prompt,
                const char *bos_text, const char *eos_text, char **out, mla_err *err);
/* The built-in template of a family. */
int chat_render_builtin(enum chat_family f, const chat_msg *msgs, size_t n, bool add_generation_prompt,
                        const char *bos_text, const char *eos_text, char **out, mla_err *err);

typedef struct chat_tmpl chat_tmpl;

/* src: the Jinja text (NULL or empty: use the built-in one). bos_text / eos_text: the texts of
 * the BOS / EOS tokens (NULL: empty). A template that does not parse because of an unsupported
 * feature selects the built-in template (with a warning); one that is not valid Jinja at all
 * also does, when family is known; otherwise the error is returned. */
int chat_tmpl_new(chat_tmpl **out, const char *src, size_t len, enum chat_family family, const char *bos_text,
                  const char *eos_text, mla_err *err);
/* Reads tokenizer.chat_template, general.architecture, tokenizer.ggml.pre; the BOS / EOS texts
 * come from the vocabulary. */
int chat_tmpl_from_gguf(chat_tmpl **out, const gguf_ctx *g, const tok_vocab *v, mla_err *err);
/* Same with the template text given (override, override_len) instead of the GGUF's
 * (--chat-template FILE); NULL: the GGUF's. A given text that does not parse (or is empty) is an
 * error, where the GGUF's own falls back to the built-in template of the model's family. */
int chat_tmpl_from_gguf_src(chat_tmpl **out, const gguf_ctx *g, const tok_vocab *v, const char *override,
                            size_t override_len, mla_err *err);
void chat_tmpl_free(chat_tmpl *t);
/* The output parsers for --reasoning-parser / --tool-parser (names of coordinator/chat_reasoning.h
 * and toolcall.h; NULL: "auto", which picks by the template's text; t may be NULL: no template,
 * no parsers): *rk an enum reasoning_kind, *tk an enum toolcall_kind. MLA_ERR on an unknown name. */
int chat_tmpl_parsers(const chat_tmpl *t, const char *reasoning, const char *tools, int *rk, int *tk, mla_err *err);

/* Renders messages, normalized first (chat_normalize with the template's own choice of
 * argument form). extra_vars (may be NULL): a JSON object of further template variables (tools,
 * enable_thinking, ...). *used (may be NULL) gets the description of the template that rendered
 * (valid while t lives). Every error of the template at this point (raise_exception, runtime
 * errors, features it lacks) is returned: no other template is tried. */
int chat_tmpl_apply(const chat_tmpl *t, const chat_msg *msgs, size_t n, bool add_generation_prompt,
                    const cJSON *extra_vars, char **out, size_t *out_len, const char **used, mla_err *err);
/* Same with the messages given as a JSON array of objects (any fields: tool_calls, ...). */
int chat_tmpl_apply_json(const chat_tmpl *t, const cJSON *messages, bool add_generation_prompt,
                         const cJSON *extra_vars, char **out, size_t *out_len, const char **used, mla_err *err);
/* Messages as templates expect them (a copy in *out, the caller deletes): content given as a
 * list of text parts joined into one string (another part type: an error naming it);
 * tool_calls[].function.arguments an object, parsed from the JSON string OpenAI clients send,
 * when args_object (an error when it is not a JSON object), else a JSON string (an object is
 * serialized). */
int chat_normalize(const cJSON *messages, bool args_object, cJSON **out, mla_err *err);
/* Claude Code starts its system prompt with a line "x-anthropic-billing-header: cc_version=...;
 * cc_entrypoint=...; cch=...;" whose version suffix and cch are hashes of the request: new with
 * every request, and at the prompt's first tokens they would leave the prefix cache nothing to
 * reuse of the turns before. The line says nothing to the model. Where t starts with it: the text
 * after its first line (empty where it is the whole text); else t. chat_normalize drops it from a
 * system message, so that a proxy that forwards Claude Code's system prompt into chat completions
 * is served as /v1/messages serves Claude Code itself (messages of that line alone: an error). */
const char *chat_past_billing_header(const char *t);
/* The template reads the top-level variable name (tools, enable_thinking, ...); false for the
 * built-in templates. */
bool chat_tmpl_uses_var(const chat_tmpl *t, const char *name);
/* The Jinja text (NULL: built-in). */
const char *chat_tmpl_source(const chat_tmpl *t);
/* Whether tool-call arguments reach the template as objects (probed at load: a template that
 * renders them so, e.g. GLM's) or as JSON strings (DeepSeek's concatenate them). */
bool chat_tmpl_args_object(const chat_tmpl *t);
/* The text every prompt of this model starts with: the template rendered with no messages and
 * no generation prompt (BOS for DeepSeek, "[gMASK]<sop>" for GLM). Plain completion prompts
 * are this prefix + the prompt text, tokenized with parse_special. Malloc'd. */
int chat_tmpl_prefix(const chat_tmpl *t, char **out, mla_err *err);
/* "gguf chat_template (jinja)" or "built-in deepseek3 (...reason...)". */
const char *chat_tmpl_used(const chat_tmpl *t);
enum chat_family chat_tmpl_family(const chat_tmpl *t);

#endif
