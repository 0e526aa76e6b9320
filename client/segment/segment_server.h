/*
 * segment_server.h - the data server (data_server.h) of this client's own DRAM
 * segment: its backend is the segment's memory (segment_server.c).
 */
#ifndef KVP_CLIENT_SEGMENT_SEGMENT_SERVER_H
#define KVP_CLIENT_SEGMENT_SEGMENT_SERVER_H

#include <stdbool.h>
#include <stdint.h>

#include "client/segment/data_server.h"
#include "common/status.h"

struct kvp_seg_record;

/*
 * Start serving [base, base+size) on host:port (port 0: any; the bound one in
 * *bound_port_p); requests carry segment id UINT64_MAX (none) until kvp_data_server_set_id
 * once the master assigned one. The memory is borrowed and must outlive the server. It
 * serves MAP (kvp_data_server_share) and rdma windows (kvp_data_server_set_windows).
 */
kvp_status_t kvp_segment_server_create(void *base, uint64_t size, const char *host, uint16_t port,
                                       bool protected_mode, kvp_data_server_t **srv_p,
                                       uint16_t *bound_port_p);
/* The segment's record (segment/seg_record.h): a write grant for a put it shows ended is
 * refused. Set once, before the first mount. */
void kvp_segment_server_set_record(kvp_data_server_t *srv, struct kvp_seg_record *record);

#endif
