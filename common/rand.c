/*
 * rand.c - seeds from getrandom(2), with the clock and pid as a fallback
 * when the kernel cannot give any.
 *
 * Thread: any; no state.
 */
#include "common/rand.h"

#include <sys/random.h>
#include <unistd.h>

#include "common/clock.h"

uint64_t kvp_random_u64(void)
{
    uint64_t v = 0;
    while (v == 0) {
        if (getrandom(&v, sizeof(v), 0) != sizeof(v))
            v = kvp_now_ns() ^ ((uint64_t)getpid() << 32);
    }
    return v;
}
