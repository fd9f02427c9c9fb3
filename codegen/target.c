/*
 * target.c - a device as the kernel compiler sees it (see target.h).
 */
#include "codegen/target.h"

#include <stdio.h>
#include <string.h>

#include "sched/schedule.h"

/* "cpu", "cpu:x", "fault+cpu": tinygrad's CLANG device. */
static bool is_clang(const char *name) {
  const char *plus = strrchr(name, '+');
  if (plus) name = plus + 1;
  return strncmp(name, "cpu", 3) == 0 && (name[3] == '\0' || name[3] == ':');
}

static bool is_gpu(const char *name) {
  const char *plus = strrchr(name, '+');
  if (!*name || strcmp(name, "default") == 0) return true;
  if (plus) name = plus + 1;
  return strncmp(name, "opencl", 6) == 0 && (name[6] == '\0' || name[6] == ':');
}

static void set_rules(kex_target *t, bool clang) {
  memset(t, 0, sizeof *t);
  snprintf(t->rules, sizeof t->rules, "%s", clang ? "cpu" : "opencl");
  t->clang_rules = clang;
  t->dialect = clang ? KEX_DIALECT_CPU : KEX_DIALECT_OPENCL;
  t->caps = clang ? kex_renderer_cpu : kex_renderer_opencl;
}

int kex_target_for_name(const char *name, kex_target *out) {
  if (!name) name = "";
  if (is_clang(name)) {
    set_rules(out, true);
    return 0;
  }
  set_rules(out, false);
  return is_gpu(name) ? 0 : KEX_EINVAL;
}

void kex_target_for_device(const kex_device_info *info, kex_target *out) {
  set_rules(out, is_clang(info->identity.kind));
  out->fp16 = info->supports_fp16;
  out->fp64 = info->supports_fp64;
  out->compute_units = info->compute_units;
  if (out->clang_rules) return; /* the C dialect has no locals or vectors to size */
  out->caps.has_local = out->caps.has_local && info->has_local;
  out->caps.has_shared = out->caps.has_shared && info->has_shared;
  out->caps.supports_float4 = out->caps.supports_float4 && info->supports_float4;
  if (!out->caps.has_shared) out->caps.shared_max = 0;
  else if ((int64_t)info->shared_max < out->caps.shared_max) out->caps.shared_max = (int64_t)info->shared_max;
  out->caps.max_local_size = out->caps.has_local ? (int64_t)info->max_work_group_size : 0;
}

kex_replay_opts kex_target_replay_opts(const kex_target *t) { return kex_replay_opts_for(t->clang_rules); }

int kex_target_lower_item(const kex_target *t, const kex_schedule *s, const kex_sched_item *it, const kex_opt *opts,
                          uint32_t nopts, kex_name_counter *names, kex_program_src *out, char *optstr,
                          size_t optstr_len, kex_error *err) {
  kex_kernel *k = NULL;
  int rc = kex_kernel_from_item(s, it, &t->caps, &k, err);
  if (!rc) rc = opts ? kex_kernel_apply_opts(k, opts, nopts, err) : kex_kernel_hand_coded_optimizations(k, err);
  if (!rc && optstr) kex_kernel_opts_string(k, optstr, optstr_len);
  if (!rc) rc = kex_lower_kernel(k, &t->caps, t->dialect, names, out, err);
  kex_kernel_free(k);
  return rc;
}
