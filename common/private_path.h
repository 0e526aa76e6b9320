/*
 * private_path.h - the check of a file or directory whose permissions are a pool's data's:
 * the DRAM segment's --segment-file, the SSD segment's file, the DFS directory and the
 * files kvpool keeps in it (docs/operations.md, "SSD segments" and "DFS segments";
 * docs/security.md, "DFS replicas").
 *
 * Such a path must be this user's (the effective uid) with no permission bit for its group
 * or others: a file mode 0600 or narrower, a directory 0700 or narrower. What kvpool creates
 * there it creates so (an explicit mode, then fchmod: the umask neither loosens nor
 * narrows it); what it finds looser it refuses at start, leaving it untouched, with the
 * path, the mode and owner found and the fix.
 *
 * Thread-safe (no state).
 */
#ifndef KVP_COMMON_PRIVATE_PATH_H
#define KVP_COMMON_PRIVATE_PATH_H

#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/status.h"

/* The mode kvpool gives what it creates: a file, a directory. */
#define KVP_PRIVATE_FILE_MODE 0600
#define KVP_PRIVATE_DIR_MODE 0700

/*
 * sb: fstat of the open file or directory `path` (`what` names it: "segment file", "DFS
 * directory"). KVP_OK when it is this user's and neither group nor others have any bit;
 * else KVP_ERR_DENIED, why[why_len] saying so and how to fix it, e.g.
 *   "SSD segment file /nvme/seg may be read or written by others (mode 0644, owner uid 0):
 *    it must be this user's (uid 0), mode 0600 or narrower (chmod 600 /nvme/seg)".
 */
static inline kvp_status_t kvp_private_path_check(const struct stat *sb, const char *what,
                                                  const char *path, char *why, size_t why_len)
{
    unsigned uid = (unsigned)geteuid();
    if ((unsigned)sb->st_uid == uid && (sb->st_mode & (S_IRWXG | S_IRWXO)) == 0)
        return KVP_OK;
    const char *mode = S_ISDIR(sb->st_mode) ? "700" : "600";
    char chown_fix[32] = "";
    if ((unsigned)sb->st_uid != uid)
        snprintf(chown_fix, sizeof(chown_fix), "chown %u ", uid);
    if (why != NULL && why_len > 0)
        snprintf(why, why_len,
                 "%s %s may be read or written by others (mode %04o, owner uid %u): it must be "
                 "this user's (uid %u), mode 0%s or narrower (%s%s%schmod %s %s)",
                 what, path, (unsigned)(sb->st_mode & 07777), (unsigned)sb->st_uid, uid, mode,
                 chown_fix, chown_fix[0] ? path : "", chown_fix[0] ? "; " : "", mode, path);
    return KVP_ERR_DENIED;
}

#endif
