/*
 * target.h - what a device is to the kernel compiler: tinygrad's rules for
 * it and the capabilities that shape its kernels (target.c).
 *
 * A target is made once per device, from its name before it is opened
 * (kex_target_for_name: the static caps of tinygrad's renderers) or from
 * what the open device reports (kex_target_for_device: local memory,
 * work-group size, vector and half/double support, each capped at what
 * tinygrad 0.9.0's renderers assume, so PoCL gets tinygrad's kernels and a
 * smaller GPU gets kernels that fit it).  Replay, hand-coded opts, beam's
 * actions, lowering and rendering read the target; this file and the
 * device factory in devices/ are the only places a device name decides
 * anything.
 */
#ifndef KEX_CODEGEN_TARGET_H
#define KEX_CODEGEN_TARGET_H

#include <stdbool.h>
#include <stddef.h>

#include "codegen/kernel.h"
#include "codegen/lower.h"
#include "core/errors.h"
#include "devices/device.h"
#include "sched/lazy.h"

#define KEX_TARGET_NAME_MAX 16

typedef struct kex_target {
  char rules[KEX_TARGET_NAME_MAX]; /* "cpu" (tinygrad's CLANG) or "opencl" (its GPU device) */
  bool clang_rules;         /* CLANG: buffer views at replay, the C dialect, no locals, no float4 */
  int dialect;              /* KEX_DIALECT_OPENCL or KEX_DIALECT_CPU (codegen/lower.h) */
  kex_renderer_caps caps;   /* what opts, lowering and rendering may use */
  bool fp16, fp64;          /* half / double support (false: unknown before the device is open) */
  int compute_units;        /* 0: unknown */
} kex_target;

/*
 * The target of a device name or kind: "cpu", "cpu:...", "fault+cpu" ->
 * tinygrad's CLANG rules; "opencl", "opencl:NAME", "fault+opencl",
 * "default", "" -> its GPU rules.  The caps are the renderers' static ones.
 * 0, or KEX_EINVAL for a name that is neither (*out is then the GPU target).
 */
int kex_target_for_name(const char *name, kex_target *out);
/*
 * The target of an open device: the rules of its identity's kind, and caps
 * from what it reports -- shared memory min(device, 32768), work-group size
 * the device's maximum (0: no limit known), float4 only when it supports it.
 */
void kex_target_for_device(const kex_device_info *info, kex_target *out);
/* The replay rules of the target (tinygrad's view_supported_devices for CLANG). */
kex_replay_opts kex_target_replay_opts(const kex_target *t);

/*
 * Lower one kernel for target t -- the one "lower a kernel with its opts"
 * step the pipeline (realize/) and beam (search/) share: schedule item it
 * of s as a Kernel, with opts[0, nopts) applied in order, or tinygrad's
 * hand-coded opts when opts is NULL; the applied opts' text into optstr
 * (may be NULL); the rendered program into *out (kex_lower_kernel's
 * ownership).  0, or a negative code with *err: KEX_EOPT naming the opt
 * that does not apply, KEX_EUNSUPPORTED, KEX_ENOMEM.
 */
int kex_target_lower_item(const kex_target *t, const struct kex_schedule *s, const struct kex_sched_item *it,
                          const kex_opt *opts, uint32_t nopts, kex_name_counter *names, kex_program_src *out,
                          char *optstr, size_t optstr_len, kex_error *err);

#endif
