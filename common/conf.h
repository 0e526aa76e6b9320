/*
 * conf.h - config files for the daemons (kvpool-master, kvpool serve), on
 * libinih (see conf.c).
 *
 * A config file is INI text. Every long flag is a key, spelled as the flag
 * without its dashes ("lease-ttl = 5", "listen = 127.0.0.1:50051"; the whole
 * name, no abbreviations); "key: value" is read the same. A flag that takes no
 * argument is a boolean key ("no-eviction = true"; true/false, yes/no, on/off,
 * 1/0, any case). Blanks around keys and values are dropped; a value is one
 * line (an indented line is not a continuation) and a line is at most 199
 * bytes. Lines starting with '#' or ';' are comments, and so is the rest of a
 * line from a ';' that follows a blank ("lease-ttl = 5 ; seconds"); a '#'
 * inside a line is part of the value. Section headers are allowed and ignored
 * except that keys under a section named differently from `section` (e.g.
 * [serve] in a file read by kvpool-master) are skipped, so one file can hold
 * both daemons' settings; keys before any section apply to both.
 *
 * The file is turned into flags placed before the command line's own, so flags
 * given on the command line override the file. A value is checked by the
 * program's own flag parsing, like the same value on the command line.
 */
#ifndef KVP_COMMON_CONF_H
#define KVP_COMMON_CONF_H

#include <getopt.h>
#include <stddef.h>

#include "common/status.h"

/*
 * Expand `--config FILE` or `--config=FILE` in argv[1 .. argc-1] (at most one;
 * other arguments untouched). Without one, *argc_out and *argv_out are argc and
 * argv and nothing is allocated. With one: a new argv = argv[0], then
 * "--KEY=VALUE" (or "--KEY" for a true boolean; nothing for a false one; for an
 * optional-argument flag "--KEY" when the value is empty) per key of the file
 * in file order, then argv[1..] without the --config pair, then NULL
 * (argv_out[*argc_out] == NULL, as in a real argv).
 *
 * --config is looked for as getopt_long will read argv: only before a bare
 * "--", never as the value of an option that takes the next argument
 * ("--name --config" sets name to "--config"; abbreviations resolved against
 * opts as getopt_long does, "--conf" included). Short options are taken to
 * have no argument. Given twice, or without a file name: an error.
 *
 * opts is the getopt_long table that will parse the result ("config" need not
 * be in it; it is taken out of the result either way). A key that is not a
 * long option there, the key "config" (no nesting), a missing value, a boolean
 * key with another value, a line that is not "key = value", "[section]" or a
 * comment, a line too long, or an unreadable file is KVP_ERR_INVALID_ARG with
 * "FILE:LINE: ..." in err (a file that cannot be opened: "cannot open config
 * file FILE: REASON"); --config twice or without a file too, with a sentence
 * in err. KVP_ERR_NOMEM when out of memory. On failure *argc_out and
 * *argv_out are not written. err: err_len bytes, always NUL-terminated on
 * failure (256 is enough but for long paths).
 * section: the section name this program reads ("master", "serve"); blanks
 * inside the brackets do not count ("[ master ]" is [master]).
 *
 * Ownership: argv is borrowed and must outlive the result, whose entries from
 * the command line are argv's own strings (getopt's optarg may point into
 * them or into the file's flags). Free the result with
 * kvp_conf_free_argv(argv_out, argv) once nothing points into it (a no-op
 * when argv_out == argv); getopt permuting the result is fine.
 * Thread: any; reentrant (libinih's settings are read, never written).
 */
kvp_status_t kvp_conf_expand_argv(int argc, char **argv, const struct option *opts,
                                  const char *section, int *argc_out, char ***argv_out, char *err,
                                  size_t err_len);
void kvp_conf_free_argv(char **argv_out, char **argv);

#endif
