/*
 * ssd_server.h - the data server (segment/data_server.h) of an SSD segment:
 * its backend is the segment's file (ssd_server.c), read and written through
 * io_uring (ssd_io.h) instead of memory.
 */
#ifndef KVP_CLIENT_SSD_SSD_SERVER_H
#define KVP_CLIENT_SSD_SSD_SERVER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "client/segment/data_server.h"
#include "client/ssd/ssd_file.h"
#include "common/status.h"

/* Listen on host:port (port 0: any; the bound one in *bound_port_p). f is borrowed
 * and must outlive the server. Requests carry segment_id; until kvp_data_server_set_id
 * it is 0. The functions below take a server made here. */
kvp_status_t kvp_ssd_server_create(kvp_ssd_file_t *f, const char *host, uint16_t port,
                                   bool protected_mode, kvp_data_server_t **srv_p,
                                   uint16_t *bound_port_p);
/* The file now records the object of this version at offset: the note of its put (data
 * grants: an older grant of the extent is refused from the put's first write) is done. */
void kvp_ssd_server_recorded(kvp_data_server_t *srv, uint64_t offset, uint64_t version);
/* The owner forgot the object (offset, version) (a FORGET task): a read of it waits no
 * longer for its RECORD. */
void kvp_ssd_server_forgot(kvp_data_server_t *srv, uint64_t offset, uint64_t version);
/* The owner found the object (offset, version) unwritten at its RECORD (its bytes not
 * those its writer declared): reads of it are refused, and the offset is reported to the
 * master as bad (kvp_ssd_server_take_bad). */
void kvp_ssd_server_unwritten(kvp_data_server_t *srv, uint64_t offset, uint64_t version);
/* A tenant's key was seen: from now on a read waits (at most 1 s) for its object's RECORD. */
void kvp_ssd_server_saw_tenants(kvp_data_server_t *srv);
/* Extents (their segment offsets) whose reads failed with an I/O error since the last
 * call, at most max (up to KVP_SSD_SERVER_BAD_MAX are kept): the owner reports them to
 * the master, which drops those copies. */
#define KVP_SSD_SERVER_BAD_MAX 64
size_t kvp_ssd_server_take_bad(kvp_data_server_t *srv, uint64_t *offsets, size_t max);
/* Extent reads or writes that failed with an I/O error since create. */
uint64_t kvp_ssd_server_io_errors(const kvp_data_server_t *srv);

#endif
