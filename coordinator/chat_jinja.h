/* chat_jinja: a small Jinja2 interpreter for chat templates (tokenizer.chat_template).
 *
 * Environment semantics follow Hugging Face transformers' apply_chat_template: trim_blocks and
 * lstrip_blocks on, loop controls (break / continue) on, `tojson` as json.dumps with
 * ensure_ascii=False (HF's own filter), raise_exception(msg) and strftime_now(fmt) as globals.
 *
 * Supported: {{ }}, {% %}, {# #} with whitespace control (- and +); if / elif / else, for (with
 * tuple targets, an `if` filter, else, loop.index / index0 / revindex / revindex0 / first /
 * last / length / previtem / nextitem), set (name, ns.attr, tuple, block), macro (with default
 * arguments), raw, generation (rendered as its body), break, continue; literals (strings,
 * numbers, lists, dicts, true/false/none), and/or/not, comparisons, in / not in, + - * / // % **,
 * ~, conditional expressions, subscripts, slices, attributes, calls with keyword arguments;
 * globals range, namespace, dict, raise_exception, strftime_now; the filters, tests and
 * str / dict methods listed in chat_jinja.c. Anything else fails with JINJA_E_UNSUPPORTED and a
 * message naming the feature.
 *
 * Ownership: jinja_parse() returns a template the caller frees with jinja_free(); it copies the
 * source. jinja_render() returns a malloc'd NUL-terminated string the caller frees. A parsed
 * template is read-only and may be rendered from several threads at once.
 */
#ifndef CHAT_JINJA_H
#define CHAT_JINJA_H

#include <cjson/cJSON.h>
#include <stdbool.h>
#include <stddef.h>

#include "common/mla_err.h"

enum jinja_status {
    JINJA_OK = 0,
    JINJA_E_SYNTAX = -1,      /* the template is not valid Jinja */
    JINJA_E_UNSUPPORTED = -2, /* valid Jinja using a feature this interpreter lacks */
    JINJA_E_RUNTIME = -3,     /* a type error, undefined access, ... while rendering */
    JINJA_E_RAISED = -4,      /* the template called raise_exception(msg) */
    JINJA_E_LIMIT = -5,       /* too much output / memory / steps / nesting */
};

typedef struct jinja_tmpl jinja_tmpl;

/* Returns JINJA_OK or a negative jinja_status with err filled ("line N: ..."). */
int jinja_parse(jinja_tmpl **out, const char *src, size_t len, mla_err *err);
void jinja_free(jinja_tmpl *t);

/* Renders with the top-level variables taken from the members of a JSON object (messages,
 * add_generation_prompt, bos_token, ...). Returns JINJA_OK or a negative jinja_status. */
int jinja_render(const jinja_tmpl *t, const cJSON *vars, char **out, size_t *out_len, mla_err *err);

/* True when the template reads the top-level variable name anywhere (a name reference in an
 * expression; its own {% set %} of the name does not count). */
bool jinja_uses_var(const jinja_tmpl *t, const char *name);

#endif
