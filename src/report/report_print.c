/*
 * report_print: a report's JSON text. Every double in its shortest form that reads back bit-exact,
 * strings as valid UTF-8 with every control escaped, arrays of plain values on one line; into a file
 * the text is streamed (report_output.c writes it there).
 */
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "report/report.h"

// ----------------------------------------------------------------------------
// printing: every double in its shortest form that reads back bit-exact (cJSON_Print stops at 15
// digits when that is "close enough"); arrays of plain values on one line. Into a file the text is
// streamed, 64 KiB at a time: a --full report is never held twice, as a tree and as text.

typedef struct {
    gcd_sb b;
    FILE *f;   // NULL: the whole text stays in b
    int ok;    // every fwrite wrote all it was given
} printer;

static void spill(printer *p, size_t at_least) {
    if (!p->f || p->b.len < at_least || !p->b.len) return;
    p->ok &= fwrite(p->b.s, 1, p->b.len, p->f) == p->b.len;
    p->b.len = 0;
}

int gcd_num_shortest(char buf[32], double v) {
    int k = 0;
    // 15 digits (DBL_DIG) read back as the shortest form of a normal double; a subnormal has fewer
    // significant bits, so its shortest form may be shorter still
    for (int digits = v != 0 && fabs(v) < DBL_MIN ? 1 : 15; digits <= 17; digits++)   // 17 digits always read back
        if ((k = snprintf(buf, 32, "%.*g", digits, v)), digits == 17 || strtod(buf, NULL) == v) break;
    return k;
}

static void print_num(gcd_sb *b, double v) {
    char buf[32];
    if (!isfinite(v)) return gcd_sb_append(b, "null", 4);   // the builders never store these as numbers
    gcd_sb_append(b, buf, (size_t)gcd_num_shortest(buf, v));
}

// a JSON string of valid UTF-8: controls (C0 and DEL) escaped, bytes that are not UTF-8 (a file name from a
// non-UTF-8 locale) replaced by U+FFFD
static void print_str(gcd_sb *b, const char *s) {
    const unsigned char *p = (const unsigned char *)s, *end = p + strlen(s);
    gcd_sb_append(b, "\"", 1);
    while (p < end) {
        const unsigned char *q = p;
        while (q < end && *q >= 0x20 && *q < 0x7f && *q != '"' && *q != '\\') q++;   // the plain run
        gcd_sb_append(b, p, (size_t)(q - p));
        if ((p = q) >= end) break;
        size_t k = *p < 0x80 ? 1 : gcd_utf8_char(p, (size_t)(end - p));
        if (!k) gcd_sb_append(b, "\\ufffd", 6), k = 1;
        else if (*p == '"' || *p == '\\') gcd_sb_printf(b, "\\%c", *p);
        else if (*p == '\n') gcd_sb_printf(b, "\\n");
        else if (*p == '\t') gcd_sb_printf(b, "\\t");
        else if (*p < 0x20 || *p == 0x7f) gcd_sb_printf(b, "\\u%04x", *p);   // DEL too: no control character
        else gcd_sb_append(b, p, k);
        p += k;
    }
    gcd_sb_append(b, "\"", 1);
}

static void print_value(printer *p, const cJSON *v, int depth) {
    gcd_sb *b = &p->b;
    if (cJSON_IsNull(v) || cJSON_IsInvalid(v)) gcd_sb_printf(b, "null");
    else if (cJSON_IsTrue(v)) gcd_sb_printf(b, "true");
    else if (cJSON_IsFalse(v)) gcd_sb_printf(b, "false");
    else if (cJSON_IsNumber(v)) print_num(b, v->valuedouble);
    else if (cJSON_IsString(v)) print_str(b, v->valuestring);
    else if (cJSON_IsRaw(v)) gcd_sb_printf(b, "%s", v->valuestring);
    else {
        int object = cJSON_IsObject(v), flat = !object;
        const cJSON *c;
        cJSON_ArrayForEach(c, v) flat &= !cJSON_IsArray(c) && !cJSON_IsObject(c);
        gcd_sb_printf(b, "%c", object ? '{' : '[');
        int i = 0;
        cJSON_ArrayForEach(c, v) {
            if (!flat) gcd_sb_printf(b, "%s\n%*s", i ? "," : "", 2 * (depth + 1), "");
            else if (i) gcd_sb_append(b, ", ", 2);
            i++;
            if (object) print_str(b, c->string), gcd_sb_printf(b, ": ");
            print_value(p, c, depth + 1);
            spill(p, 1 << 16);
        }
        if (!flat && i) gcd_sb_printf(b, "\n%*s", 2 * depth, "");
        gcd_sb_printf(b, "%c", object ? '}' : ']');
    }
}

char *gcd_json_print(const cJSON *doc) {
    printer p = { .ok = 1 };
    print_value(&p, doc, 0);
    return p.b.s;
}

int gcd_json_print_file(const cJSON *doc, FILE *f) {
    printer p = { .f = f, .ok = 1 };
    print_value(&p, doc, 0);
    gcd_sb_append(&p.b, "\n", 1);
    spill(&p, 0);
    gcd_sb_free(&p.b);
    return p.ok;
}
