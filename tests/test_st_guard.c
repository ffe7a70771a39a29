// safetensors' SIGBUS guard (gcd_st_guard_install) is installed exactly once however many threads ask
// at once (issue 33: a static `done` flag read and written unlocked let every racing thread install it,
// a data race). Deterministic: this test is linked with -Wl,--wrap=sigaction, so the library's
// sigaction(SIGBUS) comes here, where it is counted and held for 100 ms; 16 threads released together
// all ask while the first install is held. With a plain flag every one of them installs; once is right.
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <time.h>

#include "check/safetensors.h"

enum { THREADS = 16 };

int __real_sigaction(int sig, const struct sigaction *sa, struct sigaction *old);
static atomic_int installs;

int __wrap_sigaction(int sig, const struct sigaction *sa, struct sigaction *old) {
    if (sig == SIGBUS && sa) {
        atomic_fetch_add(&installs, 1);
        nanosleep(&(struct timespec){ .tv_nsec = 100 * 1000 * 1000 }, NULL);   // the window a racing thread would use
    }
    return __real_sigaction(sig, sa, old);
}

static pthread_barrier_t start;

static void *ask(void *arg) {
    (void)arg;
    pthread_barrier_wait(&start);
    gcd_st_guard_install();
    return NULL;
}

int main(void) {
    pthread_t t[THREADS];
    pthread_barrier_init(&start, NULL, THREADS);
    for (int i = 0; i < THREADS; i++)
        if (pthread_create(&t[i], NULL, ask, NULL)) return fprintf(stderr, "FAIL: pthread_create\n"), 1;
    for (int i = 0; i < THREADS; i++) pthread_join(t[i], NULL);
    gcd_st_guard_install();   // and once more, alone, later
    struct sigaction now;
    __real_sigaction(SIGBUS, NULL, &now);
    int n = atomic_load(&installs), fails = 0;
    if (n != 1) fprintf(stderr, "FAIL: %d threads asking at once installed the SIGBUS guard %d times, expected once\n", THREADS, n), fails++;
    if (now.sa_handler == SIG_DFL || now.sa_handler == SIG_IGN) fprintf(stderr, "FAIL: no SIGBUS handler installed\n"), fails++;
    if (!fails) printf("test_st_guard: %d threads, the guard installed once: passed\n", THREADS);
    return fails != 0;
}
