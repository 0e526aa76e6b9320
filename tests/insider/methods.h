/*
 * methods.h - the master's methods for the insider fuzzer (see methods.c).
 */
#ifndef KVP_TESTS_INSIDER_METHODS_H
#define KVP_TESTS_INSIDER_METHODS_H

#include <stddef.h>
#include <stdint.h>

#include <protobuf-c/protobuf-c.h>

typedef struct insider_method {
    uint16_t id;
    const char *name;
    const ProtobufCMessageDescriptor *req;  /* NULL: the body is ignored */
    const ProtobufCMessageDescriptor *resp; /* NULL: none (one-way, or empty) */
} insider_method_t;

/* Every method of the master's table, at most max: how many. */
size_t insider_methods(insider_method_t *out, size_t max);

#endif
