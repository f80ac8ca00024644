/*
 * hca_log.h - the device's log line (stderr, "hca: " prefixed). HCA_TRACE=1
 * turns on the engines' transition lines (dev->trace), written with it.
 * Private to libhcadev (not installed).
 */
#ifndef HCA_LOG_H
#define HCA_LOG_H

#include <stdio.h>

#define hca_log(_fmt, ...) \
    fprintf(stderr, "hca: " _fmt "\n", ## __VA_ARGS__)

#endif
