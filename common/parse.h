/*
 * parse.h - parsing of the values users type: host:port, sizes.
 *
 * Thread: all functions are thread-safe (no shared state).
 */
#ifndef KVP_COMMON_PARSE_H
#define KVP_COMMON_PARSE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/status.h"

/*
 * Split "host:port" into host (NUL-terminated, at most host_len-1 bytes) and
 * port. Accepts "[v6]:port". KVP_ERR_INVALID_ARG on anything else.
 */
kvp_status_t kvp_parse_hostport(const char *text, char *host, size_t host_len, uint16_t *port_p);

/* Parse "64MiB", "1g", "4096" ... into bytes. false on garbage or overflow. */
bool kvp_parse_size(const char *text, uint64_t *bytes_p);

/* The value of hex digit c (either case), or -1. */
static inline int kvp_parse_hex_digit(int c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

#endif
