/* api_constrain: a request's output constraints, parsed from the OpenAI body: `response_format`
 * ({"type": "text"}, {"type": "json_object"}, {"type": "json_schema", "json_schema": {"name",
 * "schema", "strict", "description"}}), `grammar` (GBNF text, llama.cpp's syntax) and
 * `logit_bias` ({"token id": bias in [-100, 100]}, at most API_MAX_LOGIT_BIAS entries). Every
 * constraint becomes one GBNF grammar (common/gram.h), checked here so that a bad one is a 400.
 *
 * JSON schemas (docs/structured-output.md lists the subset): type (one or a list), properties,
 * required, additionalProperties, items, minItems, maxItems, minLength, maxLength, enum, const,
 * anyOf, oneOf, $ref to #/$defs/... or #/definitions/..., and annotations (title, description,
 * default, examples, $schema, $id, $comment). Any other keyword is an error naming it and where.
 *
 * Ownership: api_constrain_parse fills a struct the caller frees with api_constrain_free; it
 * holds its own copies. api_schema_to_gbnf returns a string the caller frees. */
#ifndef API_CONSTRAIN_H
#define API_CONSTRAIN_H

#include <cjson/cJSON.h>
#include <stddef.h>
#include <stdbool.h>
#include <stdint.h>

#include "coordinator/chat_toolcall.h"

#define API_MAX_LOGIT_BIAS 300
#define API_SCHEMA_MAX_DEPTH 64
/* objects in a schema (subschemas, $defs and property maps included), counted before it is
 * compiled: a larger one is refused at once rather than compiled on the HTTP loop */
#define API_SCHEMA_MAX_NODES 4096

struct api_error;

typedef struct api_constrain {
    char *grammar; /* GBNF text, NULL when the output is free */
    bool json_format;          /* grammar is a JSON response_format's (not the request's 'grammar') */
    const cJSON *format_schema; /* its schema (points into the request document); NULL: any object */
    int64_t grammar_max_token; /* the largest id its <[id]> / !<[id]> name (-1: none) */
    uint32_t *grammar_taken;   /* the ids its <[id]> name (n_grammar_taken; NULL: none) */
    size_t n_grammar_taken;
    int32_t *bias_ids;
    float *bias_vals;
    int32_t n_bias;
} api_constrain;

/* Reads response_format, grammar and logit_bias of a request body (either kind). Token ids of
 * logit_bias are checked against the vocabulary by the caller (api_constrain_check_ids). */
int api_constrain_parse(api_constrain *c, const cJSON *root, struct api_error *e);
/* 400 for a logit_bias id, or a token id the grammar names, outside [0, n_vocab); and for a
 * grammar's <[id]> naming an end-of-generation token (is_eog(ctx, id); NULL: none checked), which
 * a token element never takes: the output ends where the grammar is complete. */
int api_constrain_check_ids(const api_constrain *c, int32_t n_vocab, bool (*is_eog)(void *ctx, int32_t id),
                            void *ctx, struct api_error *e);
void api_constrain_free(api_constrain *c);

/* The id of text as one token of the vocabulary, else -1. */
typedef int32_t (*api_constrain_token_fn)(void *ud, const char *text);

/* A chat request's tool calls held to its model's format (coordinator/chat_toolcall.h): free
 * output (any token but the format's opening marker) until the model opens its calls, then
 * calls of the offered tools, each one's name and arguments (per its parameters schema where the
 * tool is strict, or where required is set and the schema is an object schema within the subset;
 * any JSON object, or GLM's any key/value pairs, where not); required: the output must reach a call
 * (end of sequence only after one). With format (tool_choice auto beside a JSON response_format):
 * the output is either the calls or the format's JSON, from its first token, as the format alone
 * would hold it (no free text, no reasoning). */
typedef struct api_tool_grammar {
    enum toolcall_kind kind; /* deepseek, kimi-k2 or glm */
    const cJSON *tools;      /* the request's tools (checked by api_params) */
    const char *only;        /* tool_choice names this tool; NULL: every tool */
    bool required;           /* tool_choice required or named */
    bool one_call;           /* parallel_tool_calls false: one call */
    bool close_reasoning;    /* the prompt opened the reasoning: "</think>" first (a call inside the
                              * reasoning would be reasoning) */
    bool free_reasoning;     /* the prompt left it free: an output that starts (after whitespace) with
                              * "<think>" is reasoning, closed before a call; any other start content */
    bool format;             /* the answer, where it is no call, is JSON under format_schema */
    const cJSON *format_schema; /* NULL: any JSON object */
} api_tool_grammar;

/* The GBNF of q into *out (caller frees); MLA_ERR with err naming the problem: a marker of the
 * format that is not one token of the vocabulary (tok), a strict tool's schema outside the subset.
 * Where the schemas of forced tools that are not strict make a grammar too large or one that cannot
 * be matched, it is built again without them. */
int api_constrain_tools(const api_tool_grammar *q, api_constrain_token_fn tok, void *ud, char **out, char *err,
                        size_t err_len);

/* A JSON schema compiled to GBNF (root rule `root`). MLA_ERR with a message in err. */
int api_schema_to_gbnf(const cJSON *schema, char **out, char *err, size_t err_len);
/* The grammar of any JSON object (response_format json_object). */
const char *api_json_object_gbnf(void);

#endif
