/*
 * bench/pocl_costs.c - where a beam candidate's time goes on PoCL: clBuildProgram, CL_PROGRAM_BINARIES,
 * clCreateKernel, the first launch (PoCL generates and links the kernel's machine code for its local size there)
 * and a second launch, for N candidate sources (bench/pocl_candidates.py) built in programs of PER kernels each.
 *
 * Modes (comma-separated): PER builds programs of PER kernels and launches each kernel (one work-group of its local
 * size) right after creating it; bPER adds CL_PROGRAM_BINARIES after each build (what tinygrad's compile does);
 * aPER enqueues every first launch of a program before one clFinish.  Kernels are renamed apart (k<i>_<name>).
 * Not built by meson:
 *
 *   cc -O2 -o /tmp/pocl_costs bench/pocl_costs.c -lOpenCL -ljansson
 *   /usr/bin/python3 bench/pocl_candidates.py ../shared/bench-graphs/matmul512.json /tmp/mm512.json
 *   POCL_KERNEL_CACHE=0 /tmp/pocl_costs /tmp/mm512.json 24 1,24,b24,a24
 *
 * The first mode of a process also pays PoCL's one-time start (~1.2 s in its first build): put a throwaway first.
 */
#define CL_TARGET_OPENCL_VERSION 120
#include <CL/cl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct item {
  char *src;
  char name[96];
  size_t local[3];
} item;

typedef struct costs {
  double build, binary, kernel, first, second;
} costs;

static cl_context ctx;
static cl_device_id dev;
static cl_command_queue q;
static cl_mem bufs[4];

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static void set_args(cl_kernel k) {
  cl_uint na = 0;
  clGetKernelInfo(k, CL_KERNEL_NUM_ARGS, sizeof na, &na, NULL);
  for (cl_uint i = 0; i < na && i < 4; i++) clSetKernelArg(k, i, sizeof(cl_mem), &bufs[i]);
}

/* One work-group of the item's local size; its wall time added to *acc. */
static void launch(cl_kernel k, const item *it, double *acc) {
  double t0 = now();
  cl_int e = clEnqueueNDRangeKernel(q, k, 3, NULL, it->local, it->local, 0, NULL, NULL);
  clFinish(q);
  *acc += now() - t0;
  if (e) fprintf(stderr, "launch %s: %d\n", it->name, e);
}

static void run_mode(item *its, int n, const char *mode) {
  int binary = mode[0] == 'b', all_first = mode[0] == 'a', per = atoi(mode + (binary || all_first));
  costs c = {0};
  if (per < 1) per = 1;
  for (int s = 0; s < n; s += per) {
    int m = s + per <= n ? per : n - s;
    size_t len = 1;
    for (int i = 0; i < m; i++) len += strlen(its[s + i].src) + 1;
    char *src = malloc(len);
    src[0] = 0;
    for (int i = 0; i < m; i++) strcat(strcat(src, its[s + i].src), "\n");
    const char *cs = src;
    cl_int e;
    double t0 = now();
    cl_program p = clCreateProgramWithSource(ctx, 1, &cs, NULL, &e);
    if (clBuildProgram(p, 1, &dev, NULL, NULL, NULL) != CL_SUCCESS) {
      fprintf(stderr, "build failed\n");
      exit(1);
    }
    c.build += now() - t0;
    if (binary) {
      size_t sz = 0;
      t0 = now();
      clGetProgramInfo(p, CL_PROGRAM_BINARY_SIZES, sizeof sz, &sz, NULL);
      unsigned char *b = malloc(sz);
      clGetProgramInfo(p, CL_PROGRAM_BINARIES, sizeof b, &b, NULL);
      c.binary += now() - t0;
      free(b);
    }
    cl_kernel ks[256];
    for (int i = 0; i < m; i++) {
      t0 = now();
      ks[i] = clCreateKernel(p, its[s + i].name, &e);
      c.kernel += now() - t0;
      set_args(ks[i]);
      if (!all_first) launch(ks[i], &its[s + i], &c.first);
    }
    if (all_first) {
      t0 = now();
      for (int i = 0; i < m; i++)
        clEnqueueNDRangeKernel(q, ks[i], 3, NULL, its[s + i].local, its[s + i].local, 0, NULL, NULL);
      clFinish(q);
      c.first += now() - t0;
    }
    for (int i = 0; i < m; i++) {
      launch(ks[i], &its[s + i], &c.second);
      clReleaseKernel(ks[i]);
    }
    clReleaseProgram(p);
    free(src);
  }
  printf("%-5s n=%d: build %6.3f s (%6.1f ms/kernel), binaries %6.3f s (%6.1f ms/kernel), first launch %6.3f s "
         "(%6.1f ms/kernel), second %.3f s\n", mode, n, c.build, 1e3 * c.build / n, c.binary, 1e3 * c.binary / n,
         c.first, 1e3 * c.first / n, c.second);
  fflush(stdout);
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: pocl_costs CANDIDATES.json [N] [MODES]\n");
    return 2;
  }
  json_t *d = json_load_file(argv[1], 0, NULL);
  int n = (int)json_array_size(d);
  if (argc > 2 && atoi(argv[2]) > 0 && atoi(argv[2]) < n) n = atoi(argv[2]);
  item *its = calloc((size_t)n, sizeof *its);
  for (int i = 0; i < n; i++) {
    json_t *x = json_array_get(d, (size_t)i), *l = json_object_get(x, "local");
    const char *s = json_string_value(json_object_get(x, "src")), *nm = json_string_value(json_object_get(x, "name"));
    const char *at = strstr(s, nm);
    snprintf(its[i].name, sizeof its[i].name, "k%d_%s", i, nm);
    its[i].src = malloc(strlen(s) + sizeof its[i].name);
    memcpy(its[i].src, s, (size_t)(at - s));
    strcpy(its[i].src + (at - s), its[i].name);
    strcat(its[i].src, at + strlen(nm));
    for (int k = 0; k < 3; k++)
      its[i].local[k] = json_is_array(l) ? (size_t)json_integer_value(json_array_get(l, (size_t)k)) : 1;
  }
  cl_platform_id pl;
  cl_int e;
  clGetPlatformIDs(1, &pl, NULL);
  clGetDeviceIDs(pl, CL_DEVICE_TYPE_ALL, 1, &dev, NULL);
  ctx = clCreateContext(NULL, 1, &dev, NULL, NULL, &e);
  q = clCreateCommandQueue(ctx, dev, 0, &e);
  for (int i = 0; i < 4; i++) bufs[i] = clCreateBuffer(ctx, CL_MEM_READ_WRITE, 64u << 20, NULL, &e);
  char *modes = strdup(argc > 3 ? argv[3] : "1,24,b24,a24");
  for (char *t = strtok(modes, ","); t; t = strtok(NULL, ",")) run_mode(its, n, t);
  return 0;
}
