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

// The renderings read a run's setup through gcd_report_run_setup (report_json.c, which this target does
// not build: it needs the engine). Weak: where report_json.c is linked in, its definition is the one.
__attribute__((weak)) const cJSON *gcd_report_run_setup(const cJSON *doc, const cJSON *run) {
    const cJSON *s = cJSON_GetObjectItemCaseSensitive(run, "setup"), *e, *probe = cJSON_GetObjectItemCaseSensitive(run, "probe");
    if (s || !cJSON_IsString(probe)) return s;
    cJSON_ArrayForEach(e, cJSON_GetObjectItemCaseSensitive(doc, "setups")) {
        const cJSON *p = cJSON_GetObjectItemCaseSensitive(e, "probe");
        if (cJSON_IsString(p) && !strcmp(p->valuestring, probe->valuestring)) return e;
    }
    return NULL;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char err[1024];
    cJSON *doc = gcd_report_parse((const char *)data, size, "fuzz", err, sizeof err);
    if (!doc) return 0;
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
