/*
 * fuzz_report: a libFuzzer target for the report loader and the three renderings. The input is a
 * report file's bytes: gcd_report_parse accepts or refuses it; what it accepts is rendered as text,
 * Markdown and JUnit XML, and printed back as JSON, which must parse again. Build and run:
 * tests/fuzz.sh BUILD_DIR PYTHON report.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "report.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char err[1024];
    cJSON *doc = gcd_report_parse((const char *)data, size, "fuzz", err, sizeof err);
    if (!doc) return 0;
    const cJSON *run;
    cJSON_ArrayForEach(run, cJSON_GetObjectItemCaseSensitive(doc, "runs")) gcd_report_run_setup(doc, run);
    char *out[3] = { gcd_render_text(doc), gcd_render_md(doc), gcd_render_junit(doc) };
    for (int i = 0; i < 3; i++) free(out[i]);
    char *json = gcd_json_print(doc);
    cJSON *again = cJSON_Parse(json);
    if (!again) {
        fprintf(stderr, "fuzz_report: an accepted report printed back as invalid JSON\n");
        abort();
    }
    cJSON_Delete(again);
    free(json);
    cJSON_Delete(doc);
    return 0;
}
