/*
 * key.c - key validation: 1..4096 bytes of well-formed UTF-8 with no NUL.
 *
 * Design: one pass, no allocation; overlong forms, surrogates and code
 * points past U+10FFFF are refused, as is a sequence cut off by the end of
 * the key. The client checks keys before sending, the master again when
 * they arrive (keys travel with an explicit length).
 *
 * Thread: any; no state.
 */
#include "common/key.h"

#include <stdint.h>

bool kvp_key_valid(const char *key, size_t len)
{
    if (key == NULL || len == 0 || len > 4096)
        return false;
    const unsigned char *s = (const unsigned char *)key;
    size_t i = 0;
    while (i < len) {
        unsigned char c = s[i];
        if (c == 0)
            return false;
        if (c < 0x80) {
            i++;
            continue;
        }
        size_t n;
        uint32_t cp;
        if ((c & 0xE0) == 0xC0) {
            n = 1;
            cp = c & 0x1F;
        } else if ((c & 0xF0) == 0xE0) {
            n = 2;
            cp = c & 0x0F;
        } else if ((c & 0xF8) == 0xF0) {
            n = 3;
            cp = c & 0x07;
        } else {
            return false;
        }
        if (i + n >= len)
            return false;
        for (size_t k = 1; k <= n; k++) {
            if ((s[i + k] & 0xC0) != 0x80)
                return false;
            cp = (cp << 6) | (s[i + k] & 0x3F);
        }
        /* reject overlong forms, surrogates and values past U+10FFFF */
        if ((n == 1 && cp < 0x80) || (n == 2 && cp < 0x800) || (n == 3 && cp < 0x10000) ||
            (cp >= 0xD800 && cp <= 0xDFFF) || cp > 0x10FFFF)
            return false;
        i += n + 1;
    }
    return true;
}
