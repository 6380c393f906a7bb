/* libFuzzer target for coordinator/api_constrain: any bytes, parsed as JSON, as a schema and as a
 * request body's response_format / grammar / logit_bias. A refusal always names its reason; a
 * compiled schema's grammar always parses. Built only with -DMLA_FUZZ=ON (clang). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "common/gram.h"
#include "coordinator/api_constrain.h"
#include "coordinator/api_params.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    cJSON *j = cJSON_ParseWithLength((const char *)data, size);
    if (!j) return 0;
    char *g = NULL, msg[512] = "";
    if (api_schema_to_gbnf(j, &g, msg, sizeof msg) == MLA_OK) {
        gram *gr = NULL;
        mla_err e;
        if (!g || gram_parse(&gr, g, strlen(g), &e) != MLA_OK) abort();
        gram_free(gr);
        free(g);
    } else if (!msg[0] || g) {
        abort();
    }
    api_constrain c;
    api_error e;
    memset(&e, 0, sizeof e);
    if (api_constrain_parse(&c, j, &e) == MLA_OK) {
        api_constrain_check_ids(&c, 1000, NULL, NULL, &e);
        api_constrain_free(&c);
    } else if (e.status != 400 || !e.message[0] || c.grammar || c.bias_ids) {
        abort();
    }
    cJSON_Delete(j);
    return 0;
}
