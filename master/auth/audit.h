/*
 * audit.h - the audit log of admin actions (see audit.c).
 */
#ifndef KVP_MASTER_AUTH_AUDIT_H
#define KVP_MASTER_AUTH_AUDIT_H

#include <stddef.h>
#include <stdint.h>

#include "common/status.h"
#include "master/auth/admission.h"

/* After a request of c was dispatched (status s, response resp[rlen]): an admin action
 * (drain, remove-by-regex, remove-all) goes to the log as "audit: WHAT by principal P
 * (connection N from PEER): OUTCOME". Other methods: nothing. Thread: the loop. */
void kvp_audit_request(const kvp_caller_t *c, uint16_t method, const uint8_t *body, size_t len,
                       kvp_status_t s, const uint8_t *resp, size_t rlen);

#endif
