#include <stdio.h>
#include <string.h>

#include "report.h"
#include "report_render.h"


// XML text and attribute values: the five entities escaped, control characters dropped (XML 1.0 has no
// way to say them), invalid UTF-8 replaced by U+FFFD
static void xml(gcd_sb *b, const char *str) {
    const unsigned char *s = (const unsigned char *)str, *end = s + strlen(str);
    while (*s) {
        size_t k = gcd_utf8_char(s, (size_t)(end - s));
        if (!k) { gcd_sb_printf(b, "\xef\xbf\xbd"); s++; continue; }
        switch (*s) {
        case '&': gcd_sb_printf(b, "&amp;"); break;
        case '<': gcd_sb_printf(b, "&lt;"); break;
        case '>': gcd_sb_printf(b, "&gt;"); break;
        case '"': gcd_sb_printf(b, "&quot;"); break;
        case '\'': gcd_sb_printf(b, "&apos;"); break;
        default:
            if (*s >= 0x20 || *s == '\n' || *s == '\t') gcd_sb_append(b, s, k);
        }
        s += k;
    }
}

// One testcase per run, every run: a testsuite for each stretch of runs with the same title. A run under
// test fails when it has findings; a control fails when it did not show its signature, and is reported
// as skipped (with why) when it did.
char *gcd_render_junit(const cJSON *doc) {
    gcd_sb b = { 0 };
    const cJSON *runs = cJSON_GetObjectItemCaseSensitive(doc, "runs"), *exps = cJSON_GetObjectItemCaseSensitive(doc, "expectations");
    const cJSON *err = cJSON_GetObjectItemCaseSensitive(doc, "error");
    int n = 0, failures = 0, skipped = 0, errors = cJSON_IsObject(err);
    const cJSON *run, *e = exps ? exps->child : NULL;
    cJSON_ArrayForEach(run, runs) {
        n++;
        failures += !gcd_jbool(e, "met");
        skipped += gcd_jbool(e, "met") && !strcmp(gcd_jstr(e, "role"), "control");
        e = e ? e->next : NULL;
    }
    double wall = gcd_jnum(cJSON_GetObjectItemCaseSensitive(doc, "environment"), "wall_seconds");
    gcd_sb_printf(&b, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n");
    gcd_sb_printf(&b, "<testsuites name=\"gradcheck-dist\" tests=\"%d\" failures=\"%d\" errors=\"%d\" skipped=\"%d\" time=\"%.3f\">\n",
                  n + errors, failures, errors, skipped, wall == wall ? wall : 0.0);
    char t[160], open_title[160] = "";
    int open = 0;
    e = exps ? exps->child : NULL;
    cJSON_ArrayForEach(run, runs) {
        gcd_run_title(run, t, sizeof t);
        if (!open || strcmp(t, open_title)) {
            if (open) gcd_sb_printf(&b, "  </testsuite>\n");
            gcd_sb_printf(&b, "  <testsuite name=\"");
            xml(&b, t);
            gcd_sb_printf(&b, "\">\n");
            snprintf(open_title, sizeof open_title, "%s", t);
            open = 1;
        }
        gcd_sb_printf(&b, "    <testcase classname=\"gradcheck-dist.");
        xml(&b, gcd_jstr(run, "probe"));
        gcd_sb_printf(&b, "\" name=\"mode ");
        xml(&b, gcd_jstr(run, "mode"));
        gcd_sb_printf(&b, " (");
        xml(&b, gcd_jstr(run, "role"));
        gcd_sb_printf(&b, ")\">\n");
        gcd_sb b2 = { 0 };
        const cJSON *f;
        cJSON_ArrayForEach(f, cJSON_GetObjectItemCaseSensitive(run, "findings")) {
            if (gcd_jbool(f, "counts")) gcd_sb_printf(&b2, "%s: %s\n", gcd_jstr(f, "kind"), gcd_jstr(f, "message"));
        }
        if (!gcd_jbool(e, "met")) {
            gcd_sb_printf(&b, "      <failure type=\"gradient\" message=\"");
            xml(&b, gcd_jstr(e, "message"));
            gcd_sb_printf(&b, "\">");
            xml(&b, b2.s ? b2.s : "");
            gcd_sb_printf(&b, "</failure>\n");
        } else if (!strcmp(gcd_jstr(e, "role"), "control")) {
            gcd_sb_printf(&b, "      <skipped message=\"");
            xml(&b, gcd_jstr(e, "message"));
            gcd_sb_printf(&b, "\"/>\n");
        }
        if (b2.s) {
            gcd_sb_printf(&b, "      <system-out>");
            xml(&b, b2.s);
            gcd_sb_printf(&b, "</system-out>\n");
        }
        gcd_sb_free(&b2);
        gcd_sb_printf(&b, "    </testcase>\n");
        e = e ? e->next : NULL;
    }
    if (open) gcd_sb_printf(&b, "  </testsuite>\n");
    if (errors) {
        gcd_sb_printf(&b, "  <testsuite name=\"run\">\n    <testcase classname=\"gradcheck-dist\" name=\"run\">\n      <error message=\"rank %d: ", gcd_jint(err, "rank"));
        xml(&b, gcd_jstr(err, "message"));
        gcd_sb_printf(&b, "\"/>\n    </testcase>\n  </testsuite>\n");
    }
    gcd_sb_printf(&b, "</testsuites>\n");
    return b.s;
}
