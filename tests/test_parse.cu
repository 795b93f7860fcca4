// test_parse.cu: parse.h, the one reading of a number for every flag and environment variable: the whole
// string in base 10, no blank before or after, within [lo, hi] on the type kept (no wrap into range), a real
// finite; a refused value leaves the output untouched.
#include "../parse.h"
#include <limits.h>
#include <string.h>
#include "testing.h"

static void test_int64(void) {
    long long x = 0;
    CHECK(parse_int64("42", 0, 100, &x) && x == 42, "42: %lld", x);
    CHECK(parse_int64("-7", -10, 10, &x) && x == -7, "-7: %lld", x);
    CHECK(parse_int64("+5", 0, 10, &x) && x == 5, "+5: %lld", x);
    CHECK(parse_int64("1099511627776", 1, 1LL << 40, &x) && x == (1LL << 40), "2^40: %lld", x);
    x = 99;  // refused: blanks, garbage, empty, outside the range or a long long, not base-10 integers
    const char* bad[] = {"",
                         " 3",
                         "3 ",
                         "\t3",
                         "3\n",
                         "12abc",
                         "abc",
                         "1e3",
                         "3.0",
                         "0x10",
                         "--3",
                         "101",
                         "-1",
                         "9223372036854775808",
                         "-9223372036854775809",
                         "99999999999999999999"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        CHECK(!parse_int64(bad[i], 0, 100, &x) && x == 99, "'%s' must be refused in [0, 100] (x %lld)", bad[i], x);
    CHECK(!parse_int64(NULL, 0, 100, &x), "NULL must be refused");
    CHECK(parse_int64("9223372036854775807", 0, LLONG_MAX, &x) && x == LLONG_MAX, "LLONG_MAX: %lld", x);
}

static void test_int(void) {
    int x = 0;
    CHECK(parse_int("2147483647", 0, INT_MAX, &x) && x == INT_MAX, "INT_MAX: %d", x);
    CHECK(parse_int("-2147483648", INT_MIN, 0, &x) && x == INT_MIN, "INT_MIN: %d", x);
    x = 5;  // a value past an int is checked in 64 bits: 2^32 + 1 must not wrap to 1, 2^31 to -2^31
    CHECK(!parse_int("4294967297", 0, 10, &x) && x == 5, "2^32 + 1 wrapped into [0, 10]: %d", x);
    CHECK(!parse_int("2147483648", INT_MIN, INT_MAX, &x) && x == 5, "2^31 taken as an int: %d", x);
    CHECK(!parse_int("-2147483649", INT_MIN, INT_MAX, &x) && x == 5, "-2^31 - 1 taken as an int: %d", x);
    CHECK(!parse_int("1073741825", 1, 1 << 30, &x) && x == 5, "2^30 + 1 past --steps' range: %d", x);
}

static void test_double(void) {
    double x = 0;
    CHECK(parse_double("5e-4", 0, 1, &x) && x == 5e-4, "5e-4: %g", x);
    CHECK(parse_double("0.1", 0, 1, &x) && x == 0.1, "0.1 kept as a double: %.17g", x);  // (not 0.1f)
    CHECK(parse_double("-2.5", -3, 0, &x) && x == -2.5, "-2.5: %g", x);
    CHECK(parse_double("1e30", 0, 1e30, &x) && x == 1e30, "1e30 at the top of its range: %g", x);
    CHECK(parse_double("1e-400", 0, 1, &x) && x >= 0 && x < 1e-300, "1e-400 (underflow) is about 0: %g", x);
    x = 7;
    const char* bad[] = {"",    " 1",   "1 ",  "\t0.5", "0.5\n",    "12abc", "abc",    "1,5", "nan",
                         "NaN", "-nan", "inf", "-inf",  "infinity", "1e400", "-1e400", "1.5", "-0.1"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        CHECK(!parse_double(bad[i], 0, 1, &x) && x == 7, "'%s' must be refused in [0, 1] (x %g)", bad[i], x);
    CHECK(!parse_double("1e400", -INFINITY, INFINITY, &x) && x == 7, "1e400 is infinite even in (-inf, inf)");
    CHECK(!parse_double("nan", -INFINITY, INFINITY, &x) && x == 7, "nan is no number even in (-inf, inf)");
    CHECK(!parse_double(NULL, 0, 1, &x), "NULL must be refused");
}

int main(void) {
    test_int64();
    test_int();
    test_double();
    return test_summary();
}
