/*
 * hello_graph.h - the graph examples/hello.c submits, (a + b) * 2 over
 * float32[4] with a and b as inline base64 data (1 2 3 4 and 10 20 30 40);
 * tests/programs/libkex_test.c submits the same one and checks 22 44 66 88.
 */
#ifndef KEX_EXAMPLES_HELLO_GRAPH_H
#define KEX_EXAMPLES_HELLO_GRAPH_H

#define KEX_HELLO_GRAPH                                                                      \
  "{\"nodes\":["                                                                             \
  "{\"op\":\"BUFFER\",\"dtype\":\"float32\",\"shape\":[4],\"data\":\"AACAPwAAAEAAAEBAAACAQA==\"}," \
  "{\"op\":\"BUFFER\",\"dtype\":\"float32\",\"shape\":[4],\"data\":\"AAAgQQAAoEEAAPBBAAAgQg==\"}," \
  "{\"op\":\"ADD\",\"src\":[0,1]},"                                                          \
  "{\"op\":\"CONST\",\"dtype\":\"float32\",\"shape\":[4],\"value\":2.0},"                    \
  "{\"op\":\"MUL\",\"src\":[2,3]}],\"outputs\":[4]}"

#endif
