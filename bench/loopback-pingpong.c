/*
 * The machine's floor for one request at a time over loopback TCP: two
 * processes with plain blocking sockets pass a request-sized message and a
 * reply-sized one back and forth, nothing else. No server can answer one
 * request at a time faster, or with less CPU per round trip, than this on
 * the same machine; `citrine bench -c 1` against citrined and against
 * `citrined --noop` is read against it (bench/run.sh runs all three).
 *
 *   gcc -O2 -o /tmp/loopback-pingpong bench/loopback-pingpong.c
 *   /tmp/loopback-pingpong [ROUND_TRIPS] [--json FILE]
 *
 * Prints the round trips a second, the latency percentiles (p50, p99,
 * p99.9) and each side's CPU time per round trip (getrusage of its own
 * process). Message sizes are those of a single-record read of one
 * integer bin: an 80-byte request and a 48-byte reply.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define REQUEST_BYTES 80
#define REPLY_BYTES 48

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static double cpu_s(void) {
    struct rusage r;
    getrusage(RUSAGE_SELF, &r);
    return (double)r.ru_utime.tv_sec + (double)r.ru_utime.tv_usec * 1e-6 +
           (double)r.ru_stime.tv_sec + (double)r.ru_stime.tv_usec * 1e-6;
}

static void die(const char *what) {
    fprintf(stderr, "loopback-pingpong: %s: %s\n", what, strerror(errno));
    exit(2);
}

/* Moves exactly len bytes (a short read or write is continued). */
static void full(int fd, char *buf, size_t len, int writing) {
    size_t done = 0;
    while (done < len) {
        ssize_t n = writing ? write(fd, buf + done, len - done) : read(fd, buf + done, len - done);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) die(writing ? "write" : "read (peer gone?)");
        done += (size_t)n;
    }
}

static int by_value(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
    long rounds = 50000;
    const char *json = NULL;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--json") == 0 && i + 1 < argc) json = argv[++i];
        else if ((rounds = strtol(argv[i], NULL, 10)) < 1) {
            fprintf(stderr, "usage: %s [ROUND_TRIPS >= 1] [--json FILE]\n", argv[0]);
            return 2;
        }
    }
    int one = 1;
    int listener = socket(AF_INET, SOCK_STREAM, 0);
    if (listener < 0) die("socket");
    struct sockaddr_in addr = {.sin_family = AF_INET, .sin_port = 0};
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (bind(listener, (struct sockaddr *)&addr, sizeof addr) < 0) die("bind");
    socklen_t addr_len = sizeof addr;
    if (getsockname(listener, (struct sockaddr *)&addr, &addr_len) < 0) die("getsockname");
    if (listen(listener, 1) < 0) die("listen");
    /* The responder: a child process, as a server would be. */
    int to_parent[2];
    if (pipe(to_parent) < 0) die("pipe");
    pid_t child = fork();
    if (child < 0) die("fork");
    if (child == 0) {
        close(to_parent[0]);
        int s = accept(listener, NULL, NULL);
        if (s < 0) die("accept");
        setsockopt(s, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        char buf[REQUEST_BYTES] = {0};
        double c0 = cpu_s();
        for (long i = 0; i < rounds; i++) {
            full(s, buf, REQUEST_BYTES, 0);
            full(s, buf, REPLY_BYTES, 1);
        }
        double responder_us = (cpu_s() - c0) / (double)rounds * 1e6;
        full(to_parent[1], (char *)&responder_us, sizeof responder_us, 1);
        _exit(0);
    }
    close(to_parent[1]);
    int c = socket(AF_INET, SOCK_STREAM, 0);
    if (c < 0) die("socket");
    if (connect(c, (struct sockaddr *)&addr, sizeof addr) < 0) die("connect");
    setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    uint64_t *ns = malloc(sizeof(uint64_t) * (size_t)rounds);
    if (!ns) die("malloc");
    char buf[REQUEST_BYTES] = {0};
    double t0 = now_s(), c0 = cpu_s();
    for (long i = 0; i < rounds; i++) {
        double a = now_s();
        full(c, buf, REQUEST_BYTES, 1);
        full(c, buf, REPLY_BYTES, 0);
        ns[i] = (uint64_t)((now_s() - a) * 1e9);
    }
    double wall = now_s() - t0, client_us = (cpu_s() - c0) / (double)rounds * 1e6;
    double responder_us = 0;
    full(to_parent[0], (char *)&responder_us, sizeof responder_us, 0);
    waitpid(child, NULL, 0);
    qsort(ns, (size_t)rounds, sizeof *ns, by_value);
    double p50 = ns[rounds * 50 / 100] / 1e6, p99 = ns[rounds * 99 / 100] / 1e6,
           p999 = ns[rounds * 999 / 1000] / 1e6, max = ns[rounds - 1] / 1e6;
    printf("loopback ping-pong: %ld round trips in %.2f s = %.0f/s; latency ms p50 %.3f p99 %.3f "
           "p99.9 %.3f max %.3f; CPU per round trip: responder %.1f us, client %.1f us\n",
           rounds, wall, (double)rounds / wall, p50, p99, p999, max, responder_us, client_us);
    if (json) {
        FILE *f = fopen(json, "w");
        if (!f) die("fopen");
        fprintf(f,
                "{\"round_trips\":%ld,\"throughput_ops_s\":%.1f,\"p50_ms\":%.4f,\"p99_ms\":%.4f,"
                "\"p99_9_ms\":%.4f,\"max_ms\":%.4f,\"server_cpu_us_per_op\":%.2f,"
                "\"client_cpu_us_per_op\":%.2f}\n",
                rounds, (double)rounds / wall, p50, p99, p999, max, responder_us, client_us);
        fclose(f);
    }
    free(ns);
    return 0;
}
