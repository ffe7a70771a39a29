/*
 * fuzz_report: a libFuzzer target for the report loader and the three renderings. The input is a
 * report file's bytes: gcd_report_parse accepts or refuses it; what it accepts is rendered as text,
 * Markdown and JUnit XML, none with a raw control character or invalid UTF-8 whatever its strings hold,
 * and printed back as JSON, valid UTF-8, which must parse again. Build and run:
 * tests/fuzz.sh BUILD_DIR PYTHON report.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "report/report.h"

// valid UTF-8 without C0 controls (but those in allow) and DEL
static int clean(const char *text, const char *allow) {
    const unsigned char *s = (const unsigned char *)text, *end = s + strlen(text);
    while (s < end) {
        size_t k = gcd_utf8_char(s, (size_t)(end - s));
        if (!k || (*s < 0x20 && !strchr(allow, *s)) || *s == 0x7f) return 0;
        s += k;
    }
    return 1;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char err[1024];
    cJSON *doc = gcd_report_parse((const char *)data, size, "fuzz", err, sizeof err);
    if (!doc) return 0;
    const cJSON *run;
    cJSON_ArrayForEach(run, cJSON_GetObjectItemCaseSensitive(doc, "runs")) gcd_report_run_setup(doc, run);
    char *out[3] = { gcd_render_text(doc), gcd_render_md(doc), gcd_render_junit(doc) };
    for (int i = 0; i < 3; i++) {   // whatever the report's strings hold: no raw control character, valid UTF-8
        if (!clean(out[i], i == 2 ? "\n\t" : "\n")) {
            fprintf(stderr, "fuzz_report: rendering %d holds a raw control character or invalid UTF-8\n", i);
            abort();
        }
        free(out[i]);
    }
    char *json = gcd_json_print(doc);
    if (!clean(json, "\n")) {
        fprintf(stderr, "fuzz_report: the JSON printed back is not valid UTF-8\n");
        abort();
    }
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
