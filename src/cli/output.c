// The files a run or check leaves, each whole or absent.
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

#include "cli.h"

// The files a run or check leaves, each whole or absent: the JSON report at json, then the JUnit XML
// rendered from the same document at junit ("" for none). A failed write is a runtime failure: the code
// becomes 3, the document says why, and the JSON, when already written, is written again to say so.
// A path that could not be written is emptied (a reserved default name removed). Returns the code.
int write_reports(cJSON *doc, char *json, int reserved, char *junit, int code, double seconds) {
    char *path[2] = { json, junit };
    int junit_first = !strcmp(json, "-");   // stdout takes one document: the JSON last, never written twice
    for (int k = 0; k < 2; k++) {
        int i = k ^ junit_first;
        char err[PATH_MAX + 128], *xml = NULL;
        if (!path[i][0]) continue;
        int rc = i ? gcd_text_write(xml = gcd_render_junit(doc), "--junit", path[i], err, sizeof err) : gcd_report_write(doc, path[i], err, sizeof err);
        free(xml);
        if (!rc) continue;
        fprintf(stderr, "gradcheck-dist: %s\n", err);
        if (!i && reserved) unlink(json);
        path[i][0] = 0;
        if (code == 3) continue;   // the document already says what failed first
        code = 3;
        gcd_report_finish(doc, 3, err, 0, seconds);
        if (i && !junit_first && json[0] && gcd_report_write(doc, json, err, sizeof err)) fprintf(stderr, "gradcheck-dist: %s\n", err);
    }
    return code;
}

// reports/gradcheck-<UTC time>[-N].json, created empty and exclusively (O_EXCL): runs started in the
// same second never share a name. Returns 1 when a name was reserved.
int default_report_path(char *path, size_t len) {
    char stamp[32];
    time_t t = time(NULL);
    strftime(stamp, sizeof stamp, "%Y%m%dT%H%M%SZ", gmtime(&t));
    mkdir("reports", 0777);
    for (int i = 1; i < 10000; i++) {
        if (i == 1) snprintf(path, len, "reports/gradcheck-%s.json", stamp);
        else snprintf(path, len, "reports/gradcheck-%s-%d.json", stamp, i);
        int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
        if (fd >= 0) return close(fd), 1;
        if (errno != EEXIST) break;
    }
    return 0;   // the write will say why
}
