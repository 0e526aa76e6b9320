/*
 * macros.h - the few expression macros everything uses.
 */
#ifndef KVP_COMMON_MACROS_H
#define KVP_COMMON_MACROS_H

#define KVP_ARRAY_SIZE(a) (sizeof(a) / sizeof((a)[0]))
#define KVP_MIN(a, b) ((a) < (b) ? (a) : (b))
#define KVP_MAX(a, b) ((a) > (b) ? (a) : (b))

#endif
