/* chat_toolcall: finds the tool calls in a chat completion's content, per model family.
 *
 * Formats (as the models write them; docs/chat-dialects.md):
 *   deepseek  DeepSeek-V3 / R1:  <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME
 *             ```json\nARGS\n```<｜tool▁call▁end｜>...<｜tool▁calls▁end｜>
 *             DeepSeek-V3.1:     <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>NAME<｜tool▁sep｜>ARGS
 *             <｜tool▁call▁end｜>...<｜tool▁calls▁end｜>   (both read by the one parser)
 *   kimi-k2   <|tool_calls_section_begin|><|tool_call_begin|>functions.NAME:IDX
 *             <|tool_call_argument_begin|>ARGS<|tool_call_end|>...<|tool_calls_section_end|>
 *             (the model's "functions.NAME:IDX" is the call's id)
 *   glm       <tool_call>NAME<arg_key>K</arg_key><arg_value>V</arg_value>...</tool_call>, with or
 *             without newlines between the parts; V is a string where the parameter's schema
 *             allows one ("type" "string" or listing it, or an anyOf / oneOf branch that does)
 *             or the tool or the parameter is not declared; otherwise the JSON value V is
 *             (Python's True, False, None as true, false, null), else (not JSON) a string.
 * Text outside the calls is content (less the whitespace before a call and whitespace-only text
 * between or after calls). ARGS is the model's text as is (it may be invalid JSON, as
 * OpenAI documents for its own models); GLM's pairs become a JSON object.
 *
 * Like reasoning_split_text, a pure function of the whole content so far: a partial parse
 * (final = false) holds back a suffix that may start a marker, a call's name until it is
 * complete, and the arguments of the fenced DeepSeek-V3 form and of GLM until the call ends.
 * Each partial result is a prefix of the final one (content, calls, each call's arguments). A
 * final parse keeps a call cut off by the end of the text (its arguments as far as they got),
 * and drops one cut inside its name (no call, no markers in the content); text that does not
 * follow the format stays content, except inside a GLM call: text there that is not a key/value
 * pair is dropped (the call ends at its </tool_call> with the pairs before it). At most
 * TOOLCALL_MAX_CALLS calls; what follows them stays content.
 *
 * Ownership: toolcall_parse fills a result the caller frees with toolcall_result_free (its
 * strings malloc'd, or spans of the text: see toolcall_parse). tools (may be NULL) is only read.
 * Any thread. */
#ifndef CHAT_TOOLCALL_H
#define CHAT_TOOLCALL_H

#include <cjson/cJSON.h>
#include <stdbool.h>
#include <stddef.h>

#define TOOLCALL_MAX_CALLS 64
/* The markers (control tokens in the models' vocabularies). Kimi-K2's tool-call section opens
 * with either spelling (its reasoning kind also ends there). */
#define TOOLCALL_DS_CALLS_BEGIN "<\xEF\xBD\x9Ctool\xE2\x96\x81" "calls\xE2\x96\x81" "begin\xEF\xBD\x9C>"
#define TOOLCALL_DS_CALLS_END "<\xEF\xBD\x9Ctool\xE2\x96\x81" "calls\xE2\x96\x81" "end\xEF\xBD\x9C>"
#define TOOLCALL_DS_CALL_BEGIN "<\xEF\xBD\x9Ctool\xE2\x96\x81" "call\xE2\x96\x81" "begin\xEF\xBD\x9C>"
#define TOOLCALL_DS_CALL_END "<\xEF\xBD\x9Ctool\xE2\x96\x81" "call\xE2\x96\x81" "end\xEF\xBD\x9C>"
#define TOOLCALL_DS_SEP "<\xEF\xBD\x9Ctool\xE2\x96\x81sep\xEF\xBD\x9C>"
#define TOOLCALL_KIMI_SECTION_BEGIN "<|tool_calls_section_begin|>"
#define TOOLCALL_KIMI_SECTION_BEGIN1 "<|tool_call_section_begin|>"
#define TOOLCALL_KIMI_SECTION_END "<|tool_calls_section_end|>"
#define TOOLCALL_KIMI_SECTION_END1 "<|tool_call_section_end|>"
#define TOOLCALL_KIMI_CALL_BEGIN "<|tool_call_begin|>"
#define TOOLCALL_KIMI_ARG_BEGIN "<|tool_call_argument_begin|>"
#define TOOLCALL_KIMI_CALL_END "<|tool_call_end|>"
#define TOOLCALL_GLM_CALL_BEGIN "<tool_call>"
#define TOOLCALL_GLM_CALL_END "</tool_call>"
#define TOOLCALL_GLM_KEY_BEGIN "<arg_key>"
#define TOOLCALL_GLM_KEY_END "</arg_key>"
#define TOOLCALL_GLM_VAL_BEGIN "<arg_value>"
#define TOOLCALL_GLM_VAL_END "</arg_value>"

enum toolcall_kind { TOOLCALL_NONE = 0, TOOLCALL_DEEPSEEK, TOOLCALL_KIMI_K2, TOOLCALL_GLM };
#define TOOLCALL_AUTO (-1)

/* "none", "deepseek", "kimi-k2", "glm" */
const char *toolcall_kind_name(enum toolcall_kind k);
/* The names above and "auto" (TOOLCALL_AUTO); -2 when unknown. */
int toolcall_kind_parse(const char *name);
/* The format a chat template's own tool-call rendering uses, else the one of the family whose
 * turn markers it writes (TOOLCALL_NONE: neither found). */
enum toolcall_kind toolcall_auto(const char *template_src);

typedef struct toolcall {
    char *id;   /* the model's own id (kimi-k2), else NULL */
    char *name; /* NULL until the name is complete */
    char *args; /* arguments so far ("" until known); not NUL-terminated where args_view */
    size_t args_len;
    bool args_view; /* args is a span of the parsed text (valid while it is), not a copy */
    bool done;  /* its end marker was seen */
    size_t content_at; /* the content's length before it: where it stands in the text's order */
} toolcall;

typedef struct toolcall_result {
    char *content; /* text outside the calls; not NUL-terminated where content_view */
    size_t content_len;
    bool content_view; /* content is a span of the parsed text (one piece of it), not a copy */
    toolcall calls[TOOLCALL_MAX_CALLS];
    int n_calls;
    bool opened; /* a call's (or call section's) opening marker was read as one, calls or not */
} toolcall_result;

/* A stream's hints (toolcall_parse's scan), zeroed at first: where the searches that found no
 * marker over a shorter prefix of the same text may resume (the driver's, an open call's end). */
typedef struct toolcall_scan {
    size_t top[2], arg[2]; /* the search's start, where it may resume */
} toolcall_scan;

/* scan (NULL: none): kept by a caller that parses one growing text again and again, so that each
 * byte is searched about once over the stream; the result is the same with or without it.
 * Arguments and content that are one span of the text are not copied (args_view, content_view):
 * the result then points into text. */
void toolcall_parse(enum toolcall_kind k, const char *text, size_t len, bool final, const cJSON *tools,
                    toolcall_scan *scan, toolcall_result *out);
/* GLM: whether a parameter's value is the model's text (its schema allows a string: "type" is or
 * lists "string", or an anyOf / oneOf branch does), else JSON where it parses. */
bool toolcall_schema_allows_string(const cJSON *param_schema);
/* Whether says(schema) holds, or holds of a branch of its anyOf / oneOf (and so on down): says
 * answers 1 or 0 for a schema it decides, -1 to look in its branches. */
bool toolcall_schema_any(const cJSON *schema, int (*says)(const cJSON *schema));
void toolcall_result_free(toolcall_result *r);
/* Whether s[0, len) is one of format k's markers (TOOLCALL_NONE: none is). */
bool toolcall_marker(enum toolcall_kind k, const char *s, size_t len);
/* Whether it is one of Kimi-K2's call-section markers (begin or end), which also end its
 * reasoning (chat_reasoning.h). */
bool toolcall_kimi_section_marker(const char *s, size_t len);
/* Whether a tool's name can be read back from a call: the parsers trim names and end them at
 * whitespace, a control character or '<' (a marker). */
bool toolcall_name_ok(const char *name);

#endif
