/*
 * methods.c - the master's method table as the insider fuzzer sees it (its names and
 * request types, from master/dispatch.c's own table: a method added there is fuzzed with
 * no change here). Apart from insider_fuzz.c because the master's headers and the
 * client's public one cannot meet in one file.
 */
#include "tests/insider/methods.h"

#include "master/dispatch.h"

size_t insider_methods(insider_method_t *out, size_t max)
{
    size_t n_rows, n = 0;
    const kvp_method_t *rows = kvp_dispatch_table(&n_rows);
    for (size_t i = 0; i < n_rows && n < max; i++) {
        if (rows[i].handler == NULL)
            continue;
        out[n].id = rows[i].id;
        out[n].name = rows[i].name;
        out[n].req = rows[i].req_desc;
        out[n].resp = rows[i].resp_desc;
        n++;
    }
    return n;
}
