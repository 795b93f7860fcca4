// parse.h: the one reading of a number from text, for every flag (options.h) and every environment variable
// (comm.h, options.h). The whole string is the number: base 10 (a real may also have a fraction and an
// exponent), no blank before or after ("12abc", "", " 3" are refused), and it lies in [lo, hi] on the type it
// is kept in; a real must also be finite (nan, inf and 1e400, which overflows to inf, are refused). Each
// function gives 1 with *x set, or 0 with *x untouched: the caller says which flag or variable, the value,
// and the range expected.
#pragma once
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>

static inline int parse_int64(const char* v, long long lo, long long hi, long long* x) {
    if (!v || !*v || isspace((unsigned char)*v)) return 0;  // (strtoll would skip leading blanks)
    char* end;
    errno = 0;
    long long y = strtoll(v, &end, 10);
    if (errno || *end || y < lo || y > hi) return 0;  // errno: beyond a long long's range
    *x = y;
    return 1;
}

static inline int parse_int(const char* v, int lo, int hi, int* x) {
    long long y;
    if (!parse_int64(v, lo, hi, &y)) return 0;  // checked against [lo, hi] in 64 bits: no wrap into range
    *x = (int)y;
    return 1;
}

static inline int parse_double(const char* v, double lo, double hi, double* x) {
    if (!v || !*v || isspace((unsigned char)*v)) return 0;
    char* end;
    double y = strtod(v, &end);
    if (*end || !isfinite(y) || !(y >= lo && y <= hi)) return 0;
    *x = y;
    return 1;
}
