// TCP ping-pong over loopback: N round trips of 1 byte, prints p50/p90 in microseconds
// (bench/nft_rtt.py builds and runs it).
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <time.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <arpa/inet.h>
#include <sys/socket.h>
#include <sys/wait.h>
static int cmp(const void *a, const void *b) { double x = *(double *)a, y = *(double *)b; return x < y ? -1 : x > y; }
int main(int argc, char **argv) {
    int n = argc > 1 ? atoi(argv[1]) : 20000;
    int ls = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    bind(ls, (void *)&a, sizeof a); listen(ls, 1);
    socklen_t l = sizeof a; getsockname(ls, (void *)&a, &l);
    pid_t p = fork();
    if (p == 0) {
        int c = accept(ls, 0, 0), one = 1; char b;
        setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        while (read(c, &b, 1) == 1) write(c, &b, 1);
        _exit(0);
    }
    int s = socket(AF_INET, SOCK_STREAM, 0), one = 1; char b = 'x';
    connect(s, (void *)&a, sizeof a);
    setsockopt(s, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    double *t = malloc(sizeof(double) * n);
    for (int i = 0; i < 1000; i++) { write(s, &b, 1); read(s, &b, 1); }
    for (int i = 0; i < n; i++) {
        struct timespec t0, t1; clock_gettime(CLOCK_MONOTONIC, &t0);
        write(s, &b, 1); read(s, &b, 1);
        clock_gettime(CLOCK_MONOTONIC, &t1);
        t[i] = (t1.tv_sec - t0.tv_sec) * 1e6 + (t1.tv_nsec - t0.tv_nsec) / 1e3;
    }
    close(s); wait(0);
    qsort(t, n, sizeof(double), cmp);
    printf("p50 %.2f us p90 %.2f us (n=%d)\n", t[n / 2], t[n * 9 / 10], n);
    return 0;
}
