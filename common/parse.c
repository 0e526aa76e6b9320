/*
 * parse.c - host:port and size parsing.
 *
 * Design: strict spellings (a port is decimal digits only, no sign or
 * blanks; a size is digits and one optional unit), so a typo is refused
 * rather than read as something else. Out-parameters are written only on
 * success.
 *
 * Thread: any; no state.
 */
#include "common/parse.h"

#include <ctype.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

kvp_status_t kvp_parse_hostport(const char *text, char *host, size_t host_len, uint16_t *port_p)
{
    if (text == NULL || host_len == 0)
        return KVP_ERR_INVALID_ARG;
    const char *colon;
    const char *hstart = text;
    size_t hlen;
    if (text[0] == '[') {
        const char *close = strchr(text, ']');
        if (close == NULL || close[1] != ':')
            return KVP_ERR_INVALID_ARG;
        hstart = text + 1;
        hlen = (size_t)(close - hstart);
        colon = close + 1;
    } else {
        colon = strrchr(text, ':');
        if (colon == NULL)
            return KVP_ERR_INVALID_ARG;
        hlen = (size_t)(colon - text);
    }
    if (hlen == 0 || hlen >= host_len)
        return KVP_ERR_INVALID_ARG;
    const char *ps = colon + 1;
    if (*ps == '\0' || strspn(ps, "0123456789") != strlen(ps) || strlen(ps) > 5)
        return KVP_ERR_INVALID_ARG; /* digits only: no sign, no blanks */
    unsigned long port = strtoul(ps, NULL, 10);
    if (port > 65535)
        return KVP_ERR_INVALID_ARG;
    memcpy(host, hstart, hlen);
    host[hlen] = '\0';
    *port_p = (uint16_t)port;
    return KVP_OK;
}

bool kvp_parse_size(const char *text, uint64_t *bytes_p)
{
    if (text == NULL || !isdigit((unsigned char)text[0]))
        return false;
    char *end;
    errno = 0;
    unsigned long long v = strtoull(text, &end, 10);
    if (errno != 0)
        return false;
    uint64_t mult = 1;
    if (*end != '\0') {
        char u = (char)tolower((unsigned char)*end);
        switch (u) {
        case 'k':
            mult = 1ull << 10;
            break;
        case 'm':
            mult = 1ull << 20;
            break;
        case 'g':
            mult = 1ull << 30;
            break;
        case 't':
            mult = 1ull << 40;
            break;
        case 'b':
            mult = 1;
            break;
        default:
            return false;
        }
        end++;
        if (u != 'b') {
            if (strcasecmp(end, "ib") == 0 || strcasecmp(end, "b") == 0)
                end += strlen(end);
        }
        if (*end != '\0')
            return false;
    }
    if (v > UINT64_MAX / mult)
        return false;
    *bytes_p = v * mult;
    return true;
}
