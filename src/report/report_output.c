/*
 * report_output: where a report (or the JUnit text) goes, and writing it there whole or not at all.
 * The path is walked one name at a time from a directory descriptor, so that what is checked is what
 * is written; devices and FIFOs are written straight through, never replaced.
 */
#define _GNU_SOURCE   // fopencookie
#include <dirent.h>
#include <linux/magic.h>
#include <poll.h>
#include <sys/random.h>
#include <sys/statfs.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "report/report.h"

// ----------------------------------------------------------------------------
// where a report goes: the path walked one name at a time from a directory descriptor, so that what is
// checked is what is written. A link is followed only when nobody else could have planted it: owned by
// this user or root, in a directory no other user controls (the kernel's protected_symlinks rule, made
// to hold in every directory: root never follows a link another user placed into a file root owns).

typedef struct {
    int dirfd;                 // the directory the last name is in
    char base[NAME_MAX + 1];   // the last name
    int magic;                 // a /proc fd link (/dev/stdout, /dev/fd/N): only the kernel can follow it
    int exists;                // base is there (lstat'ed into st)
    struct stat st;
} place;

// another user can add, remove or swap names in directory d
static int others_control(const struct stat *d) {
    uid_t me = geteuid();
    return (d->st_uid != me && d->st_uid != 0) || ((d->st_mode & (S_IWGRP | S_IWOTH)) && !(d->st_mode & S_ISVTX));
}

static int on_procfs(int fd) {
    struct statfs s;
    return fstatfs(fd, &s) == 0 && s.f_type == PROC_SUPER_MAGIC;
}

static int failed(char *err, size_t len, const char *what, const char *path, int e) {
    snprintf(err, len, "%s: cannot write %s: %s", what, path, strerror(e ? e : EIO));
    return -1;
}

// Walks path to its last name. 0: *out (the caller closes out->dirfd); -2: refused (a link someone else
// controls: bad input); -1: failed. err names the path as it was given.
static int walk(const char *what, const char *path, place *out, char *err, size_t len) {
    char rest[PATH_MAX * 2 + 2], name[NAME_MAX + 1] = "";
    if (strlen(path) >= PATH_MAX) return failed(err, len, what, path, ENAMETOOLONG);
    snprintf(rest, sizeof rest, "%s", path);
    *out = (place){ .dirfd = -1 };
    int fd = open(path[0] == '/' ? "/" : ".", O_PATH | O_DIRECTORY | O_CLOEXEC), hops = 0;
    if (fd < 0) return failed(err, len, what, path, errno);
    const char *p = rest;
    for (;;) {
        while (*p == '/') p++;
        size_t n = strcspn(p, "/");
        int last = !p[n + strspn(p + n, "/")];
        if (!n) {
            close(fd);
            snprintf(err, len, "%s: %s is a directory", what, path);
            return -2;
        }
        if (n > NAME_MAX) return close(fd), failed(err, len, what, path, ENAMETOOLONG);
        memcpy(name, p, n), name[n] = 0;
        p += n;
        struct stat ln, dir;
        if (fstatat(fd, name, &ln, AT_SYMLINK_NOFOLLOW) != 0) {
            if (errno == ENOENT && last) break;   // a new file
            int e = errno;
            return close(fd), failed(err, len, what, path, e);
        }
        if (S_ISLNK(ln.st_mode)) {
            int theirs = ln.st_uid != geteuid() && ln.st_uid != 0;
            if (fstat(fd, &dir) != 0 || theirs || others_control(&dir)) {
                close(fd);
                snprintf(err, len, "%s: %s: '%s' is a link %s (uid %u): not followed; give the path it points to", what, path, name,
                         theirs ? "another user owns" : "in a directory another user controls", (unsigned)(theirs ? ln.st_uid : dir.st_uid));
                return -2;
            }
            if (last && on_procfs(fd)) {   // /proc/self/fd/1 reads "pipe:[123]": opened as it is
                out->magic = 1;
                break;
            }
            char target[PATH_MAX], tail[PATH_MAX * 2 + 2];
            ssize_t k = readlinkat(fd, name, target, sizeof target - 1);
            if (k <= 0 || ++hops > 40 || (size_t)k + strlen(p) + 1 >= sizeof rest) {
                int e = k <= 0 ? errno : ELOOP;
                return close(fd), failed(err, len, what, path, e);
            }
            target[k] = 0;
            size_t nt = strlen(p);
            memcpy(tail, p, nt + 1);
            memcpy(rest, target, (size_t)k), memcpy(rest + k, tail, nt + 1);
            p = rest;
            if (target[0] == '/') {
                close(fd);
                if ((fd = open("/", O_PATH | O_DIRECTORY | O_CLOEXEC)) < 0) return failed(err, len, what, path, errno);
            }
            continue;
        }
        if (last && !S_ISDIR(ln.st_mode)) {
            out->exists = 1, out->st = ln;
            break;
        }
        if (last) {
            close(fd);
            snprintf(err, len, "%s: %s is a directory", what, path);
            return -2;
        }
        int next = openat(fd, name, O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        if (next < 0) {
            int e = errno;
            close(fd);
            if (e != ELOOP) return failed(err, len, what, path, e);
            snprintf(err, len, "%s: %s: '%s' became a link while it was opened: not followed", what, path, name);
            return -2;
        }
        close(fd);
        fd = next;
    }
    out->dirfd = fd;
    memcpy(out->base, name, sizeof name);
    return 0;
}

int gcd_output_check(const char *what, const char *path, char *err, size_t len) {
    if (!strcmp(path, "-")) return 0;
    place pl;
    int rc = walk(what, path, &pl, err, len);
    if (rc) return rc;   // a FIFO is not opened here: a reader would take our close for the end of the report
    close(pl.dirfd);
    return rc;
}

// where path ends up: the same (st_dev, st_ino) for what exists, the directory's and the last name's for
// what does not yet; "-" is stdout. 0 when it cannot be told (the writer reports that)
int gcd_output_identity(const char *path, gcd_output_id *id) {
    *id = (gcd_output_id){ 0 };
    struct stat st;
    if (!strcmp(path, "-")) {
        if (fstat(1, &st)) return 0;
        return id->dev = st.st_dev, id->ino = st.st_ino, 1;
    }
    place pl;
    char err[64];
    if (walk("", path, &pl, err, sizeof err)) return 0;
    int ok = pl.magic ? fstatat(pl.dirfd, pl.base, &st, 0) == 0 : pl.exists ? 1 : fstat(pl.dirfd, &st) == 0;
    if (pl.exists && !pl.magic) st = pl.st;
    if (ok) id->dev = st.st_dev, id->ino = st.st_ino;
    if (ok && !pl.exists && !pl.magic) snprintf(id->name, sizeof id->name, "%s", pl.base);   // not there yet: the directory and the name
    close(pl.dirfd);
    return ok;
}

int gcd_output_same(const char *a, const char *b) {
    gcd_output_id x, y;
    if (!strcmp(a, b)) return 1;
    if (!gcd_output_identity(a, &x) || !gcd_output_identity(b, &y)) return 0;
    return x.dev == y.dev && x.ino == y.ino && !strcmp(x.name, y.name);
}

// ----------------------------------------------------------------------------
// writing: whole or not at all

#define WAIT_FOR_READER_MS 60000   // a pipe or FIFO whose reader takes nothing for this long: the write fails
#define WAIT_FOR_OPEN_MS 10000     // a FIFO that nobody opens for reading for this long: the same

// writes to fd; a pipe's reader that stalls for a minute ends the write (the fd is non-blocking)
typedef struct { int fd; } sink;

static ssize_t sink_write(void *c, const char *buf, size_t n) {
    sink *s = c;
    size_t done = 0;
    while (done < n) {
        ssize_t k = write(s->fd, buf + done, n - done);
        if (k > 0) { done += (size_t)k; continue; }
        if (k < 0 && errno == EINTR) continue;
        if (k < 0 && errno == EAGAIN) {
            struct pollfd pf = { s->fd, POLLOUT, 0 };
            int r = poll(&pf, 1, WAIT_FOR_READER_MS);
            if (r > 0 && !(pf.revents & (POLLERR | POLLHUP))) continue;
            errno = r == 0 ? ETIMEDOUT : pf.revents & POLLHUP ? EPIPE : EIO;
        }
        return done ? (ssize_t)done : -1;
    }
    return (ssize_t)done;
}

static int sink_close(void *c) {
    (void)c;
    return 0;
}

// Straight into an open descriptor: stdout, a device, a FIFO, a /proc fd link. ENOSPC, short writes
// and a reader that stalls are errors.
static int emit(const cJSON *doc, const char *text, FILE *f) { return doc ? gcd_json_print_file(doc, f) : !text || fputs(text, f) >= 0; }

static int write_fd(const cJSON *doc, const char *text, int fd) {
    sink s = { fd };
    FILE *f = fopencookie(&s, "w", (cookie_io_functions_t){ .write = sink_write, .close = sink_close });
    if (!f) return 0;
    errno = 0;
    int ok = emit(doc, text, f) && fflush(f) == 0;
    int saved = errno;
    ok &= fclose(f) == 0;
    errno = saved;
    return ok;
}

static int write_stdout(const cJSON *doc, const char *text) {
    errno = 0;
    int ok = emit(doc, text, stdout) && fflush(stdout) == 0 && !ferror(stdout);
    if (!ok && !errno) errno = EIO;
    return ok;
}

// A writer killed mid-write leaves NAME.tmp.XXXXXX: the next write of NAME removes those over an hour
// old (exactly that name pattern, regular files only, never a fresh one: it may be another writer's)
static void remove_stale_temporaries(int dirfd, const char *stem) {
    int fd = openat(dirfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    DIR *d = fd < 0 ? NULL : fdopendir(fd);
    if (!d && fd >= 0) close(fd);
    size_t nb = strlen(stem);
    struct dirent *e;
    while (d && (e = readdir(d))) {
        const char *n = e->d_name;
        struct stat st;
        if (strncmp(n, stem, nb) || strncmp(n + nb, ".tmp.", 5) || strlen(n + nb + 5) != 6) continue;
        if (fstatat(dirfd, n, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISREG(st.st_mode) && time(NULL) - st.st_mtime > 3600) unlinkat(dirfd, n, 0);
    }
    if (d) closedir(d);
}

// a new temporary beside base, created by this process alone (O_EXCL, no link followed), 0600
static int make_temporary(int dirfd, const char *stem, char *tmp, size_t len) {
    static const char abc[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    for (int tries = 0; tries < 100; tries++) {
        unsigned char r[6];
        if (getrandom(r, sizeof r, 0) != sizeof r)
            for (int i = 0; i < 6; i++) r[i] = (unsigned char)(rand() ^ getpid() ^ (int)time(NULL));
        snprintf(tmp, len, "%s.tmp.%c%c%c%c%c%c", stem, abc[r[0] % 62], abc[r[1] % 62], abc[r[2] % 62], abc[r[3] % 62], abc[r[4] % 62], abc[r[5] % 62]);
        int fd = openat(dirfd, tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
        if (fd >= 0 || errno != EEXIST) return fd;
    }
    return -1;
}

static int write_file(const cJSON *doc, const char *text, const char *what, const char *path, char *err, size_t len);

int gcd_report_write(const cJSON *doc, const char *path, char *err, size_t len) {
    return write_file(doc, NULL, "report", path, err, len);
}

int gcd_text_write(const char *text, const char *what, const char *path, char *err, size_t len) {
    return write_file(NULL, text, what, path, err, len);
}

// doc printed, or text as it is, into path: whole or not at all. 0, -1 failed, -2 refused (err says why)
static int write_file(const cJSON *doc, const char *text, const char *what, const char *path, char *err, size_t len) {
    if (!strcmp(path, "-")) return write_stdout(doc, text) ? 0 : failed(err, len, what, "to stdout", errno);
    place pl;
    int rc = walk(what, path, &pl, err, len);
    if (rc) return rc;
    if (pl.magic || (pl.exists && !S_ISREG(pl.st.st_mode))) {   // a device, a FIFO, stdout: never replaced, never removed
        int fd, waited = 0;   // a FIFO nobody opens for reading within WAIT_FOR_OPEN_MS: the write fails
        while ((fd = openat(pl.dirfd, pl.base, O_WRONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC | (pl.magic ? O_APPEND : O_NOFOLLOW))) < 0 &&
               errno == ENXIO && waited < WAIT_FOR_OPEN_MS)
            poll(NULL, 0, 100), waited += 100;
        struct stat st;
        if (fd >= 0 && fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && !pl.magic) {   // swapped for a file since: replaced as one, below
            close(fd);
            pl.exists = 1, pl.st = st;
        } else {
            int ok = fd >= 0 && write_fd(doc, text, fd), e = errno;
            if (fd >= 0) ok &= close(fd) == 0;
            close(pl.dirfd);
            if (fd < 0 && e == ENXIO) return snprintf(err, len, "%s: cannot write %s: a FIFO that nobody opened for reading in %d s", what, path, WAIT_FOR_OPEN_MS / 1000), -1;
            return ok ? 0 : failed(err, len, what, path, e);
        }
    }
    char stem[NAME_MAX + 1], tmp[NAME_MAX + 1];
    snprintf(stem, sizeof stem, "%.*s", NAME_MAX - 11, pl.base);   // a 255-byte name still has a temporary
    remove_stale_temporaries(pl.dirfd, stem);
    int fd = make_temporary(pl.dirfd, stem, tmp, sizeof tmp);
    if (fd < 0) return rc = errno, close(pl.dirfd), failed(err, len, what, path, rc);
    mode_t mask = umask(0);
    umask(mask);
    FILE *f = fdopen(fd, "w");
    errno = 0;
    int ok = f && emit(doc, text, f) && fflush(f) == 0 && fchmod(fd, 0666 & ~mask) == 0 && fsync(fd) == 0;   // a report is as any new file here
    int saved = errno;
    if (f) ok &= fclose(f) == 0;
    else close(fd);
    if (ok && renameat(pl.dirfd, tmp, pl.dirfd, pl.base) != 0) ok = 0, saved = errno;
    if (!ok) unlinkat(pl.dirfd, tmp, 0);
    close(pl.dirfd);
    return ok ? 0 : failed(err, len, what, path, saved);
}
