/*
 * status.c - string table for kvp_status_t, generated from KVP_STATUS_LIST.
 */
#include "common/status.h"

const char *kvp_strerror(kvp_status_t status)
{
    switch (status) {
#define KVP_STATUS_CASE_(name, value, msg)                                                         \
    case name:                                                                                     \
        return msg;
        KVP_STATUS_LIST(KVP_STATUS_CASE_)
#undef KVP_STATUS_CASE_
    }
    return "unknown status";
}
