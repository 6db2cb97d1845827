/* A crash ends an AdaSpark process in one line: fatal_signal.py says why and what it replaces.
 *
 * install() puts fatal_signal_handler in the place of SIGSEGV, SIGBUS, SIGFPE, SIGILL and SIGABRT;
 * set_line() keeps the line it writes, in three parts: head, the signal's words, tail. Then it
 * exits with code 2, or (chain) puts the handler it replaced back and raises the signal again, for
 * that one (Python's faulthandler: the Python stack) once this one returns. It only calls
 * write, _exit, sigaction and raise, all async-signal-safe, and reads buffers nobody frees:
 * whatever state the crash left the heap and Python in, it neither allocates nor takes a lock. */
#define _XOPEN_SOURCE 700
#include <signal.h>
#include <string.h>
#include <unistd.h>

#define LINE_MAX_BYTES 2048
#define ALT_STACK_BYTES 65536

static char alt_stack[ALT_STACK_BYTES]; /* the handler's stack where the crash was the stack's overflow */

static char head[LINE_MAX_BYTES], tail[LINE_MAX_BYTES];
static volatile size_t head_len, tail_len;
static const int signals[] = {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT};
#define N_SIGNALS (sizeof(signals) / sizeof(signals[0]))
static struct sigaction replaced[N_SIGNALS];
static int chain;

static const char *words(int sig)
{
    switch (sig) {
    case SIGSEGV: return "a segmentation fault, SIGSEGV";
    case SIGBUS: return "a bus error, SIGBUS";
    case SIGFPE: return "an arithmetic fault, SIGFPE";
    case SIGILL: return "an instruction this CPU does not have, SIGILL";
    case SIGABRT: return "an abort, SIGABRT";
    default: return "a fatal signal";
    }
}

static void put(const char *text, size_t len)
{
    while (len > 0) {
        ssize_t n = write(2, text, len);
        if (n <= 0)
            return;
        text += n;
        len -= (size_t)n;
    }
}

static void fatal_signal_handler(int sig)
{
    const char *w = words(sig);
    put(head, head_len);
    put(w, strlen(w));
    put(tail, tail_len);
    if (!chain)
        _exit(2);
    for (size_t i = 0; i < N_SIGNALS; i++)
        if (signals[i] == sig)
            sigaction(sig, &replaced[i], NULL);
    raise(sig); /* blocked until this returns; a fault's instruction, run again, faults again too */
}

static size_t copy(char *dst, const char *src)
{
    size_t n = strlen(src);
    if (n >= LINE_MAX_BYTES)
        n = LINE_MAX_BYTES - 1;
    memcpy(dst, src, n);
    dst[n] = '\0';
    return n;
}

/* The line's parts, as UTF-8: the handler writes head, the signal's words, then tail. */
void adaspark_fatal_set_line(const char *new_head, const char *new_tail)
{
    head_len = 0; /* a crash while the parts change writes less, never half a copy's bytes beyond */
    tail_len = 0;
    size_t t = copy(tail, new_tail);
    size_t h = copy(head, new_head);
    tail_len = t;
    head_len = h;
}

/* The handler in each signal's place; on a stack of its own in the calling thread (a deep recursion
 * that overflowed the stack leaves none to run it on), the crashing thread's stack in others.
 * chain: after the line, the replaced handler ends the process (see the top). 0, or -1 if a step
 * failed. */
int adaspark_fatal_install(int chain_to_replaced)
{
    chain = chain_to_replaced;
    int rc = 0;
    stack_t ss;
    memset(&ss, 0, sizeof(ss));
    ss.ss_sp = alt_stack;
    ss.ss_size = sizeof(alt_stack);
    if (sigaltstack(&ss, NULL) != 0)
        rc = -1;
    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = fatal_signal_handler;
    sigemptyset(&sa.sa_mask);
    for (size_t i = 0; i < N_SIGNALS; i++)
        sigaddset(&sa.sa_mask, signals[i]);
    sa.sa_flags = SA_ONSTACK;
    for (size_t i = 0; i < N_SIGNALS; i++)
        if (sigaction(signals[i], &sa, &replaced[i]) != 0)
            rc = -1;
    return rc;
}

/* Which signal's handler is ours (1) or not (0): tests and the reports read it. */
int adaspark_fatal_installed(int sig)
{
    struct sigaction sa;
    if (sigaction(sig, NULL, &sa) != 0)
        return 0;
    return sa.sa_handler == fatal_signal_handler;
}
