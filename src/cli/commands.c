// `check DUMP... [--ref REF [--ref REF2]]`, the user's own gradients, and `report FILE`, a saved report rendered.
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <poll.h>
#include <sys/prctl.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cli/cli.h"

// ----------------------------------------------------------------------------
// check DUMP... [--ref REF]: the user's own gradients

// --json and --junit never write over what check reads (a dump, the --ref file): -2, having said so
static int outputs_not_inputs(const gcd_check_set *set, const char *json, const char *junit) {
    const char *out[2] = { json, junit }, *flag[2] = { "--json", "--junit" };
    for (int i = 0; i < 2; i++) {
        if (!out[i] || !strcmp(out[i], "-")) continue;
        for (int k = 0; k < set->world + 2; k++) {
            const char *in = k < set->world ? set->rank[k].path : k == set->world ? (set->has_ref ? set->ref.path : NULL) : (set->has_ref2 ? set->ref2.path : NULL);
            if (in && gcd_output_same(out[i], in)) return bad(flag[i], "'%s' is one of the files check reads (a dump or --ref): give the report its own path", out[i]), -2;
        }
    }
    return 0;
}

int check_main(int argc, char **argv) {
    const char **dumps = gcd_malloc((size_t)argc * sizeof *dumps), **ignore = gcd_malloc((size_t)argc * sizeof *ignore);
    gcd_check_opts o = { .dumps = dumps, .ignore = ignore };
    const char *json = NULL, *junit = NULL;
    int no_json = 0, rc = 0;
    for (int i = 2; i < argc && !rc; i++) {
        const gcd_option *opt;
        const char *v;
        if ((rc = gcd_next_option(argc, argv, &i, CMD_CHECK, &opt, &v))) break;
        if (!opt) { dumps[o.ndumps++] = v; continue; }
        switch ((opt_id)opt->id) {
        case OPT_REF:
            if (o.nref == 2) rc = bad(opt->name, "at most two references (the reference, and the same in another order), got a third: '%s'", v);
            else o.ref[o.nref++] = v;
            break;
        case OPT_TIMEOUT: {
            char *end;
            o.timeout = strtod(v, &end);
            if (end == v || *end || !(o.timeout > 0 && o.timeout <= 1e6)) rc = bad(opt->name, "expected seconds from 0 to 1e6, got '%s'", v);
            break;
        }
        case OPT_IGNORE: ignore[o.nignore++] = v; break;
        case OPT_JSON: json = v; break;
        case OPT_JUNIT: junit = v; break;
        case OPT_NO_JSON: no_json = 1; break;
        case OPT_SNIPPET: {
            fputs(gcd_check_snippet, stdout);
            free(dumps), free(ignore);
            return stdout_done("check --snippet");
        }
        case OPT_TOL: {
            char *end;
            o.tol = strtod(v, &end);
            if (end == v || *end || !isfinite(o.tol) || o.tol <= 0 || o.tol >= 1) rc = bad(opt->name, "expected a number between 0 and 1, got '%s'", v);
            break;
        }
        default: GCD_FATAL("check: option %s in the table but not parsed", opt->name);   // --help: main.c answered it
        }
    }
    if (!rc && !o.ndumps) rc = bad("check", "%s", "missing DUMP... or DIR (one safetensors dump per rank; see check --snippet)");
    if (!rc && no_json && json) rc = bad("--no-json", "%s", "conflicts with --json");
    if (!json) no_json = 1;   // check writes its JSON report only where asked (--json): never a reports/ here unasked
    if (!rc && !no_json) rc = report_path_ok("--json", json);
    if (!rc && junit) rc = junit_path_ok(junit, json);
    o.no_hash = no_json;   // the digest of each dump goes into the report; without one, no hashing
    if (rc) { free(dumps), free(ignore); return rc; }

    double t0 = now();
    char err[2048];
    gcd_check_set set;
    gcd_run_result res = { 0 };
    rc = gcd_check_load(&o, &set, err, sizeof err);
    if (!rc) rc = gcd_check_scan(&o, &set, &res, err, sizeof err);
    res.seconds = now() - t0;
    if (!rc) rc = outputs_not_inputs(&set, no_json ? NULL : json, junit);
    if (rc) {
        if (rc != -2) say("check: ", err);
        rc = rc == -2 ? 2 : rc;
        gcd_run_result_free(&res);
        gcd_check_free(&set);
        free(dumps), free(ignore);
        return rc;
    }
    gcd_env env = { .backend = "dumps", .world = set.world };
    time_t t = time(NULL);
    strftime(env.start_time, sizeof env.start_time, "%Y-%m-%dT%H:%M:%SZ", gmtime(&t));
    cJSON *doc = gcd_report_new(argc, argv, &env);
    gcd_report_add_check(doc, &set, &res);
    int code = gcd_run_has_finding(&res);
    const char *first = "";
    for (int i = 0; i < res.nfinding; i++)
        if (res.finding[i].counts) { first = res.finding[i].message; break; }
    gcd_sb msg = { 0 };
    gcd_sb_printf(&msg, "check stage %s (under test): %s", set.stage, code ? first : "no finding");
    gcd_report_add_expectation(doc, "check", set.stage, "test", !code, msg.s);
    gcd_sb_free(&msg);

    char path[PATH_MAX] = "", xml[PATH_MAX] = "";
    if (json) snprintf(path, sizeof path, "%s", json);
    if (junit) snprintf(xml, sizeof xml, "%s", junit);
    int reserved = !json && !no_json && default_report_path(path, sizeof path);
    gcd_report_finish(doc, code, NULL, 0, now() - t0);
    code = write_reports(doc, path, reserved, xml, code, now() - t0);
    FILE *out = (json && !strcmp(json, "-")) || (junit && !strcmp(junit, "-")) ? stderr : stdout;
    char *text = gcd_render_text_width(doc, gcd_text_width(fileno(out)));
    fputs(text, out);
    free(text);
    if (path[0] && strcmp(path, "-")) put_path(out, "report: ", path);
    if (xml[0] && strcmp(xml, "-")) put_path(out, "junit: ", xml);
    if (out == stdout && stdout_done("check")) code = 3;
    if (out == stderr && (fflush(out) || ferror(out) || stream_lost(2))) code = 3;   // the table is lost: stdout holds the document
    cJSON_Delete(doc);
    gcd_run_result_free(&res);
    gcd_check_free(&set);
    free(dumps), free(ignore);
    return code;
}

// ----------------------------------------------------------------------------
// report FILE

int report_main(int argc, char **argv) {
    const char *file = NULL, *format = "text";
    for (int i = 2; i < argc; i++) {
        const gcd_option *opt;
        const char *v;
        int rc = gcd_next_option(argc, argv, &i, CMD_REPORT, &opt, &v);
        if (rc) return rc;
        if (opt && opt->id == OPT_FORMAT) format = v;   // one of the table's values
        else if (opt) GCD_FATAL("report: option %s in the table but not parsed", opt->name);
        else if (file) return bad("report", "one FILE only, got a second: '%s'", v);
        else file = v;
    }
    if (!file) return bad("report", "%s", "missing FILE (a gradcheck-dist JSON report)");
    char err[1024];
    errno = 0;
    cJSON *doc = gcd_report_load(file, err, sizeof err);
    int memory = errno == ENOMEM;   // more than this machine lets us take: a runtime failure, not bad input
    if (!doc) return say("report: ", err), memory ? 3 : 2;
    char *text = !strcmp(format, "md") ? gcd_render_md(doc) : !strcmp(format, "junit") ? gcd_render_junit(doc) : gcd_render_text(doc);
    fputs(text, stdout);
    free(text);
    cJSON_Delete(doc);
    return stdout_done("report");
}
