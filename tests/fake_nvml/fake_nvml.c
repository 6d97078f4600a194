/*
 * A fake libnvidia-ml.so.1 for loadline's tests: the NVML calls the agent makes, answered from a
 * script file the test writes (path in FAKE_NVML_SCRIPT), re-read on every call so a test can change
 * the GPUs' state while the agent runs. Built at test time with the system C compiler and loaded by
 * the real pynvml through LD_LIBRARY_PATH, so the binding's own ctypes code runs end to end.
 *
 * Script lines (blank lines and lines starting with '#' are ignored):
 *   init CODE                      nvmlInit's return code (default 0)
 *   driver VERSION                 nvmlSystemGetDriverVersion
 *   error CALL CODE                CALL (a function name or '*') returns CODE for every device
 *   I name TEXT...                 device I: nvmlDeviceGetName (rest of the line)
 *   I uuid TEXT                    nvmlDeviceGetUUID
 *   I memory TOTAL RESERVED USED   bytes; free = TOTAL - RESERVED - USED. The v2 call reports these;
 *                                  v1 reports used = RESERVED + USED, as drivers since 510 do
 *   I cc MAJOR MINOR               nvmlDeviceGetCudaComputeCapability
 *   I nvlink 0|1                   nvmlDeviceGetNvLinkState of link 0 (absent: NOT_SUPPORTED)
 *   I proc PID BYTES               a compute process (BYTES -1: not available)
 *   I vanish N                     N processes exit between the two process-list calls
 *   I error CALL CODE              CALL ('*' for all) on device I returns CODE
 * The device count is 1 + the highest index named. Compile with -DFAKE_NVML_NO_MEMORY_V2 for a driver
 * that predates nvmlDeviceGetMemoryInfo_v2 (the symbol is then absent).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int nvmlReturn_t;
typedef struct fake_device { unsigned int index; } *nvmlDevice_t;

typedef struct { unsigned long long total, free, used; } nvmlMemory_t;
typedef struct { unsigned int version; unsigned long long total, reserved, free, used; } nvmlMemory_v2_t;
typedef struct {
  unsigned int pid;
  unsigned long long usedGpuMemory;
  unsigned int gpuInstanceId, computeInstanceId;
} nvmlProcessInfo_t;

#define NVML_SUCCESS 0
#define NVML_ERROR_UNINITIALIZED 1
#define NVML_ERROR_INVALID_ARGUMENT 2
#define NVML_ERROR_NOT_SUPPORTED 3
#define NVML_ERROR_INSUFFICIENT_SIZE 7
#define NVML_ERROR_DRIVER_NOT_LOADED 9
#define NVML_ERROR_ARGUMENT_VERSION_MISMATCH 25
#define NVML_MEMORY_V2 0x02000028u

#define MAX_DEVICES 16
#define MAX_PROCS 64
#define MAX_ERRORS 32
#define TEXT 128

struct error_rule { int device; char call[TEXT]; int code; }; /* device -1: every device */
struct proc { unsigned int pid; unsigned long long bytes; };
struct device {
  char name[TEXT], uuid[TEXT];
  unsigned long long total, reserved, used;
  int has_memory, cc_major, cc_minor, nvlink, vanish, nprocs;
  struct proc procs[MAX_PROCS];
};
struct script {
  int init_code, count, nerrors;
  char driver[TEXT];
  struct error_rule errors[MAX_ERRORS];
  struct device devices[MAX_DEVICES];
};

static struct script S;
static struct fake_device handles[MAX_DEVICES];
static int initialised;

static void copy(char *dst, const char *src) {
  strncpy(dst, src, TEXT - 1);
  dst[TEXT - 1] = '\0';
  dst[strcspn(dst, "\r\n")] = '\0';
}

static void load(void) {
  memset(&S, 0, sizeof S);
  for (int i = 0; i < MAX_DEVICES; i++) S.devices[i].nvlink = -1;
  copy(S.driver, "550.54.15");
  const char *path = getenv("FAKE_NVML_SCRIPT");
  FILE *f = path ? fopen(path, "r") : NULL;
  if (!f) { S.init_code = NVML_ERROR_DRIVER_NOT_LOADED; return; }
  char line[512], word[TEXT], call[TEXT];
  while (fgets(line, sizeof line, f)) {
    int n = 0, code = 0;
    if (line[0] == '#' || sscanf(line, "%127s%n", word, &n) != 1) continue;
    char *rest = line + n;
    while (*rest == ' ' || *rest == '\t') rest++;
    if (!strcmp(word, "init")) { S.init_code = atoi(rest); continue; }
    if (!strcmp(word, "driver")) { copy(S.driver, rest); continue; }
    if (!strcmp(word, "error")) {
      if (sscanf(rest, "%127s %d", call, &code) == 2 && S.nerrors < MAX_ERRORS) {
        S.errors[S.nerrors].device = -1;
        copy(S.errors[S.nerrors].call, call);
        S.errors[S.nerrors++].code = code;
      }
      continue;
    }
    int index = atoi(word);
    if (index < 0 || index >= MAX_DEVICES) continue;
    if (index + 1 > S.count) S.count = index + 1;
    struct device *d = &S.devices[index];
    if (sscanf(rest, "%127s%n", word, &n) != 1) continue;
    rest += n;
    while (*rest == ' ' || *rest == '\t') rest++;
    if (!strcmp(word, "name")) copy(d->name, rest);
    else if (!strcmp(word, "uuid")) copy(d->uuid, rest);
    else if (!strcmp(word, "memory"))
      d->has_memory = sscanf(rest, "%llu %llu %llu", &d->total, &d->reserved, &d->used) == 3;
    else if (!strcmp(word, "cc")) sscanf(rest, "%d %d", &d->cc_major, &d->cc_minor);
    else if (!strcmp(word, "nvlink")) d->nvlink = atoi(rest);
    else if (!strcmp(word, "vanish")) d->vanish = atoi(rest);
    else if (!strcmp(word, "proc") && d->nprocs < MAX_PROCS) {
      long long bytes = 0;
      unsigned int pid = 0;
      if (sscanf(rest, "%u %lld", &pid, &bytes) == 2) {
        d->procs[d->nprocs].pid = pid;
        d->procs[d->nprocs++].bytes = (unsigned long long)bytes; /* -1 wraps to "not available" */
      }
    } else if (!strcmp(word, "error") && S.nerrors < MAX_ERRORS) {
      if (sscanf(rest, "%127s %d", call, &code) == 2) {
        S.errors[S.nerrors].device = index;
        copy(S.errors[S.nerrors].call, call);
        S.errors[S.nerrors++].code = code;
      }
    }
  }
  fclose(f);
}

/* The scripted error of CALL on DEVICE (-1: a system call), or 0. */
static int scripted(const char *call, int device) {
  for (int i = 0; i < S.nerrors; i++) {
    struct error_rule *r = &S.errors[i];
    if ((r->device == -1 || r->device == device) && (!strcmp(r->call, "*") || !strcmp(r->call, call)))
      return r->code;
  }
  return 0;
}

/* Common entry of every device call: the script reloaded, the handle checked, scripted errors. */
static nvmlReturn_t enter(const char *call, nvmlDevice_t device, struct device **out) {
  if (!initialised) return NVML_ERROR_UNINITIALIZED;
  load();
  if (!device || device < handles || device >= handles + MAX_DEVICES) return NVML_ERROR_INVALID_ARGUMENT;
  int index = (int)device->index;
  if (index >= S.count) return NVML_ERROR_INVALID_ARGUMENT;
  int code = scripted(call, index);
  if (code) return code;
  *out = &S.devices[index];
  return NVML_SUCCESS;
}

static nvmlReturn_t put_text(const char *text, char *buffer, unsigned int length) {
  if (!buffer || strlen(text) + 1 > length) return NVML_ERROR_INSUFFICIENT_SIZE;
  strcpy(buffer, text);
  return NVML_SUCCESS;
}

nvmlReturn_t nvmlInitWithFlags(unsigned int flags) {
  (void)flags;
  load();
  if (S.init_code) return S.init_code;
  initialised = 1;
  return NVML_SUCCESS;
}
nvmlReturn_t nvmlInit_v2(void) { return nvmlInitWithFlags(0); }
nvmlReturn_t nvmlInit(void) { return nvmlInitWithFlags(0); }

nvmlReturn_t nvmlShutdown(void) {
  if (!initialised) return NVML_ERROR_UNINITIALIZED;
  initialised = 0;
  return NVML_SUCCESS;
}

const char *nvmlErrorString(nvmlReturn_t result) {
  switch (result) {
    case 0: return "Success";
    case 3: return "Not Supported";
    case 9: return "Driver Not Loaded";
    case 15: return "GPU is lost";
    default: return "Unknown Error";
  }
}

nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length) {
  if (!initialised) return NVML_ERROR_UNINITIALIZED;
  load();
  int code = scripted("nvmlSystemGetDriverVersion", -1);
  return code ? code : put_text(S.driver, version, length);
}

nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *count) {
  if (!initialised) return NVML_ERROR_UNINITIALIZED;
  load();
  int code = scripted("nvmlDeviceGetCount_v2", -1);
  if (code) return code;
  if (!count) return NVML_ERROR_INVALID_ARGUMENT;
  *count = (unsigned int)S.count;
  return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device) {
  if (!initialised) return NVML_ERROR_UNINITIALIZED;
  load();
  if (!device || index >= (unsigned int)S.count) return NVML_ERROR_INVALID_ARGUMENT;
  int code = scripted("nvmlDeviceGetHandleByIndex_v2", (int)index);
  if (code) return code;
  handles[index].index = index;
  *device = &handles[index];
  return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length) {
  struct device *d;
  nvmlReturn_t r = enter("nvmlDeviceGetName", device, &d);
  return r ? r : put_text(d->name, name, length);
}

nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length) {
  struct device *d;
  nvmlReturn_t r = enter("nvmlDeviceGetUUID", device, &d);
  return r ? r : put_text(d->uuid, uuid, length);
}

nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory) {
  struct device *d;
  nvmlReturn_t r = enter("nvmlDeviceGetMemoryInfo", device, &d);
  if (r) return r;
  if (!d->has_memory) return NVML_ERROR_NOT_SUPPORTED;
  if (!memory) return NVML_ERROR_INVALID_ARGUMENT;
  memory->total = d->total;
  memory->used = d->reserved + d->used;
  memory->free = d->total - d->reserved - d->used;
  return NVML_SUCCESS;
}

#ifndef FAKE_NVML_NO_MEMORY_V2
nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *memory) {
  struct device *d;
  nvmlReturn_t r = enter("nvmlDeviceGetMemoryInfo_v2", device, &d);
  if (r) return r;
  if (!memory) return NVML_ERROR_INVALID_ARGUMENT;
  if (memory->version != NVML_MEMORY_V2) return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
  if (!d->has_memory) return NVML_ERROR_NOT_SUPPORTED;
  memory->total = d->total;
  memory->reserved = d->reserved;
  memory->used = d->used;
  memory->free = d->total - d->reserved - d->used;
  return NVML_SUCCESS;
}
#endif

nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t device, unsigned int *count,
                                                     nvmlProcessInfo_t *infos) {
  struct device *d;
  nvmlReturn_t r = enter("nvmlDeviceGetComputeRunningProcesses_v3", device, &d);
  if (r) return r;
  if (!count) return NVML_ERROR_INVALID_ARGUMENT;
  unsigned int n = (unsigned int)d->nprocs;
  if (!infos || *count < n) {  /* the sizing call, as NVML answers it */
    *count = n;
    return n ? NVML_ERROR_INSUFFICIENT_SIZE : NVML_SUCCESS;
  }
  /* Processes that exited since the sizing call are simply not listed any more. */
  unsigned int gone = d->vanish > 0 ? (unsigned int)d->vanish : 0;
  n = gone >= n ? 0 : n - gone;
  for (unsigned int i = 0; i < n; i++) {
    infos[i].pid = d->procs[i].pid;
    infos[i].usedGpuMemory = d->procs[i].bytes;
    infos[i].gpuInstanceId = 0xFFFFFFFFu;
    infos[i].computeInstanceId = 0xFFFFFFFFu;
  }
  *count = n;
  return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetCudaComputeCapability(nvmlDevice_t device, int *major, int *minor) {
  struct device *d;
  nvmlReturn_t r = enter("nvmlDeviceGetCudaComputeCapability", device, &d);
  if (r) return r;
  if (!major || !minor) return NVML_ERROR_INVALID_ARGUMENT;
  *major = d->cc_major;
  *minor = d->cc_minor;
  return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetNvLinkState(nvmlDevice_t device, unsigned int link, int *active) {
  struct device *d;
  nvmlReturn_t r = enter("nvmlDeviceGetNvLinkState", device, &d);
  if (r) return r;
  if (d->nvlink < 0 || link != 0) return NVML_ERROR_NOT_SUPPORTED;
  if (!active) return NVML_ERROR_INVALID_ARGUMENT;
  *active = d->nvlink;
  return NVML_SUCCESS;
}
