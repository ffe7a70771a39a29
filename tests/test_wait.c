// The NCCL backend's waiting (src/wait.c) driven by a fake communicator, stream and clock: in progress
// then done, an async error, a CUDA error, a stall past the timeout (aborted once, and the fatal path's
// exit 3 naming the call and the rank), and a peer that is slow to arrive but then makes progress.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"
#include "util.h"
#include "comm/wait.h"

// ----------------------------------------------------------------------------
// the fake: everything is a time on its own clock, which only pause() moves

typedef struct {
    double t, step;             // the clock, and how far one pause moves it
    double arrive_at;           // when the last rank enters the call
    double ready_at;            // when the communicator stops answering ncclInProgress
    double done_at;             // when the stream has drained
    double comm_fail_at;        // when ncclCommGetAsyncError starts answering an error
    double stream_fail_at;      // when cudaStreamQuery starts answering an error
    int comm_polls, stream_polls, early_stream_polls, aborts;
    int say_abort;              // print each abort (the fatal test counts them on stderr)
} fake;

static gcd_poll fake_comm(void *ctx, char *why, size_t len) {
    fake *f = ctx;
    f->comm_polls++;
    if (f->t >= f->comm_fail_at) return snprintf(why, len, "NCCL reports remote process exited or there was a network error"), GCD_POLL_FAILED;
    return f->t >= f->ready_at ? GCD_POLL_DONE : GCD_POLL_PENDING;
}

static gcd_poll fake_stream(void *ctx, char *why, size_t len) {
    fake *f = ctx;
    f->stream_polls++;
    if (f->t < f->ready_at) f->early_stream_polls++;   // the work may not be on the stream yet
    if (f->t >= f->stream_fail_at) return snprintf(why, len, "cudaStreamQuery: an illegal memory access was encountered"), GCD_POLL_FAILED;
    return f->t >= f->done_at ? GCD_POLL_DONE : GCD_POLL_PENDING;
}

static int fake_arrived(void *ctx) { return ((fake *)ctx)->t >= ((fake *)ctx)->arrive_at; }
static double fake_now(void *ctx) { return ((fake *)ctx)->t; }
static void fake_pause(void *ctx) { ((fake *)ctx)->t += ((fake *)ctx)->step; }

static void fake_abort(void *ctx) {
    fake *f = ctx;
    f->aborts++;
    if (f->say_abort) fprintf(stderr, "fake: ncclCommAbort\n");
}

static const gcd_wait_ops ops = { fake_comm, fake_stream, fake_arrived, fake_abort, fake_now, fake_pause };

// a rank whose call is on its way: every rank there, ready and drained at once, nothing failing
static fake healthy(void) {
    return (fake){ .step = 0.01, .comm_fail_at = INFINITY, .stream_fail_at = INFINITY };
}

// ----------------------------------------------------------------------------

static void wait_should_return_after_in_progress(void) {
    char msg[512] = "";
    fake f = healthy();
    f.ready_at = 0.3, f.done_at = 0.9;
    gcd_wait_status s = gcd_wait(&ops, &f, "ncclAllReduce", 1, 5, msg, sizeof msg);
    CHECK(s == GCD_WAIT_OK, "status %d: %s", s, msg);
    CHECK(f.aborts == 0, "%d aborts", f.aborts);
    CHECK(f.comm_polls > 20, "ncclInProgress answered %d times: the wait did not wait", f.comm_polls);
    CHECK(f.early_stream_polls == 0, "the stream was asked %d times while the call was still ncclInProgress", f.early_stream_polls);
    CHECK(f.t >= 0.9 && f.t < 0.9 + 2 * f.step, "returned at t = %g, the stream drained at 0.9", f.t);

    // the communicator alone (init, finalize): the stream is none of its business
    f = healthy();
    f.ready_at = 2, f.done_at = INFINITY;
    s = gcd_wait(&ops, &f, "ncclCommInitRankConfig", 0, 5, msg, sizeof msg);
    CHECK(s == GCD_WAIT_OK && f.stream_polls == 0, "status %d, %d stream polls: %s", s, f.stream_polls, msg);
    CHECK(f.t >= 2 && f.t < 2 + 2 * f.step, "returned at t = %g, the communicator was ready at 2", f.t);
}

static void wait_should_abort_once_on_an_error(void) {
    char msg[512] = "";
    fake f = healthy();   // ncclInProgress, then an async error
    f.ready_at = INFINITY, f.comm_fail_at = 1;
    gcd_wait_status s = gcd_wait(&ops, &f, "ncclAllReduce", 1, 60, msg, sizeof msg);
    CHECK(s == GCD_WAIT_FAILED, "status %d", s);
    CHECK(f.aborts == 1, "%d aborts, expected 1", f.aborts);
    CHECK(strstr(msg, "ncclAllReduce: NCCL reports remote process exited"), "message: %s", msg);
    CHECK(f.t < 1 + 2 * f.step, "the error came at t = 1, reported at %g: it waited for the timeout", f.t);

    f = healthy();        // on the stream already, then an async error (the peer died mid-collective)
    f.done_at = INFINITY, f.comm_fail_at = 2;
    s = gcd_wait(&ops, &f, "ncclAllGather", 1, 60, msg, sizeof msg);
    CHECK(s == GCD_WAIT_FAILED && f.aborts == 1 && f.t < 2 + 2 * f.step, "status %d, %d aborts, t %g", s, f.aborts, f.t);

    f = healthy();        // an async error while a peer has not even arrived: no clock, but the error counts
    f.arrive_at = INFINITY, f.done_at = INFINITY, f.comm_fail_at = 3;
    s = gcd_wait(&ops, &f, "ncclAllGather", 1, 60, msg, sizeof msg);
    CHECK(s == GCD_WAIT_FAILED && f.aborts == 1, "status %d, %d aborts", s, f.aborts);

    f = healthy();        // a CUDA error on the stream
    f.done_at = INFINITY, f.stream_fail_at = 0.5;
    s = gcd_wait(&ops, &f, "ncclReduceScatter", 1, 60, msg, sizeof msg);
    CHECK(s == GCD_WAIT_FAILED && f.aborts == 1, "status %d, %d aborts", s, f.aborts);
    CHECK(strstr(msg, "ncclReduceScatter: cudaStreamQuery: an illegal memory access"), "message: %s", msg);
}

static void wait_should_time_out_on_a_stall(void) {
    char msg[512] = "";
    fake f = healthy();   // every rank there, the kernel never finishes
    f.step = 0.25, f.done_at = INFINITY;
    gcd_wait_status s = gcd_wait(&ops, &f, "ncclAllGather", 1, 5, msg, sizeof msg);
    CHECK(s == GCD_WAIT_TIMEOUT, "status %d", s);
    CHECK(f.aborts == 1, "%d aborts, expected 1", f.aborts);
    CHECK(f.t > 5 && f.t <= 5 + 2 * f.step, "timed out at t = %g, the limit is 5", f.t);
    CHECK(strstr(msg, "ncclAllGather: no progress 5 s after every rank had entered it"), "message: %s", msg);

    f = healthy();        // an init that never leaves ncclInProgress (a peer that never joins)
    f.ready_at = INFINITY;
    s = gcd_wait(&ops, &f, "ncclCommInitRankConfig", 0, 3, msg, sizeof msg);
    CHECK(s == GCD_WAIT_TIMEOUT && f.aborts == 1 && f.stream_polls == 0, "status %d, %d aborts, %d stream polls", s, f.aborts, f.stream_polls);
}

// Rank 0 computes the single-process reference between two collectives; the others wait for it inside
// the next one. That is not a stuck peer: the clock starts when the last rank arrives.
static void wait_should_not_count_a_busy_peer(void) {
    char msg[512] = "";
    fake f = healthy();
    f.step = 0.5, f.arrive_at = 600, f.done_at = 602;
    gcd_wait_status s = gcd_wait(&ops, &f, "ncclAllReduce", 1, 5, msg, sizeof msg);
    CHECK(s == GCD_WAIT_OK, "a peer busy for 600 s, then 2 s of collective under a 5 s limit: status %d: %s", s, msg);
    CHECK(f.aborts == 0, "%d aborts", f.aborts);

    f = healthy();        // the same peer arrives, and then the collective stalls: timed from the arrival
    f.step = 0.5, f.arrive_at = 600, f.done_at = INFINITY;
    s = gcd_wait(&ops, &f, "ncclAllReduce", 1, 5, msg, sizeof msg);
    CHECK(s == GCD_WAIT_TIMEOUT && f.aborts == 1, "status %d, %d aborts", s, f.aborts);
    CHECK(f.t > 605 && f.t <= 605 + 2 * f.step, "timed out at t = %g, expected just after 605", f.t);
}

// gcd_wait_check on a stall: "rank 1: ncclReduceScatter: no progress ..." on stderr, exit 3, one abort
static void wait_check_should_end_the_rank_with_exit_3(void) {
    int fd[2];
    if (pipe(fd)) { perror("pipe"); exit(1); }
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0) { perror("fork"); exit(1); }
    if (pid == 0) {
        dup2(fd[1], 2);
        close(fd[0]);
        gcd_fatal_setup(1, NULL, NULL);   // rank 1, no MPI: the fatal path ends in exit(3)
        fake f = healthy();
        f.done_at = INFINITY, f.say_abort = 1;
        gcd_wait_check(&ops, &f, "ncclReduceScatter", 1, 2);
        _exit(0);   // a stall that returned
    }
    close(fd[1]);
    char out[4096] = "";
    size_t n = 0;
    ssize_t k;
    while (n < sizeof out - 1 && (k = read(fd[0], out + n, sizeof out - 1 - n)) > 0) n += (size_t)k;
    close(fd[0]);
    int status;
    waitpid(pid, &status, 0);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 3, "exit status %d, expected 3; stderr: %s", WIFEXITED(status) ? WEXITSTATUS(status) : -1, out);
    CHECK(strstr(out, "gradcheck-dist: rank 1: ncclReduceScatter: no progress 2 s"), "stderr must name the rank and the call: %s", out);
    int aborts = 0;
    for (const char *p = out; (p = strstr(p, "fake: ncclCommAbort")); p++) aborts++;
    CHECK(aborts == 1, "%d aborts before the exit, expected 1: %s", aborts, out);
    const char *abort_at = strstr(out, "fake: ncclCommAbort"), *fatal_at = strstr(out, "no progress");
    CHECK(abort_at && fatal_at && abort_at < fatal_at, "the communicator must be aborted before the job ends: %s", out);
}

int main(void) {
    wait_should_return_after_in_progress();
    wait_should_abort_once_on_an_error();
    wait_should_time_out_on_a_stall();
    wait_should_not_count_a_busy_peer();
    wait_check_should_end_the_rank_with_exit_3();
    printf("test_wait: %s, %d failure(s)\n", check_failures ? "FAILED" : "passed", check_failures);
    return check_failures != 0;
}
