/*
 * replay.c - main() for a fuzz target built without libFuzzer: every file
 * given on the command line, or found in a folder given there, is passed to
 * LLVMFuzzerTestOneInput once, so a corpus runs as an ordinary test (under
 * ASan+UBSan in build-asan).  Files named *.pending in a folder are
 * skipped: inputs bench/fuzz found that crash code not fixed yet (rename one
 * once its bug is fixed, and it is replayed from then on).  Exit 1 when
 * nothing was replayed.
 */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int run_file(const char *path) {
  FILE *f = fopen(path, "rb");
  if (!f) return -1;
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  uint8_t *buf = malloc(n > 0 ? (size_t)n : 1);
  size_t got = buf ? fread(buf, 1, (size_t)(n > 0 ? n : 0), f) : 0;
  fclose(f);
  if (!buf) return -1;
  LLVMFuzzerTestOneInput(buf, got);
  free(buf);
  return 0;
}

static int run_dir(const char *dir, int *count) {
  DIR *d = opendir(dir);
  if (!d) return -1;
  struct dirent *e;
  while ((e = readdir(d))) {
    size_t n = strlen(e->d_name);
    if (e->d_name[0] == '.' || (n > 8 && strcmp(e->d_name + n - 8, ".pending") == 0)) continue;
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
    if (run_file(path) == 0) (*count)++;
  }
  closedir(d);
  return 0;
}

int main(int argc, char **argv) {
  int count = 0;
  for (int i = 1; i < argc; i++)
    if (run_dir(argv[i], &count) < 0 && run_file(argv[i]) == 0) count++;
  printf("%s: replayed %d inputs\n", argv[0], count);
  return count > 0 ? 0 : 1;
}
