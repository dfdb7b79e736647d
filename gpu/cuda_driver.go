//go:build cgo && linux

package gpu

/*
#cgo LDFLAGS: -ldl
#include <dlfcn.h>
#include <stdint.h>
#include <stddef.h>
#include <string.h>
#include <stdlib.h>
#include <stdio.h>

// The few driver API types kvctl needs, declared here so that no CUDA toolkit is needed to
// build. Handles travel to Go as uintptr_t.
typedef int CUresult;
typedef int CUdevice;
typedef uint64_t CUdeviceptr;
typedef struct { char reserved[64]; } kvIpcHandle;
typedef struct { int type; int id; } kvMemLocation;
typedef struct {
	int type;
	int requestedHandleTypes;
	kvMemLocation location;
	void *win32HandleMetaData;
	struct {
		unsigned char compressionType;
		unsigned char gpuDirectRDMACapable;
		unsigned short usage;
		unsigned char reserved[4];
	} allocFlags;
} kvAllocProp;
typedef struct { kvMemLocation location; int flags; } kvAccessDesc;
typedef struct {
	int srcAccessOrder;
	kvMemLocation srcLocHint;
	kvMemLocation dstLocHint;
	unsigned int flags;
} kvMemcpyAttributes;

static struct {
	void *lib;
	CUresult (*init)(unsigned int);
	CUresult (*driverGetVersion)(int *);
	CUresult (*deviceGetCount)(int *);
	CUresult (*deviceGet)(CUdevice *, int);
	CUresult (*deviceGetName)(char *, int, CUdevice);
	CUresult (*deviceGetAttribute)(int *, int, CUdevice);
	CUresult (*primaryCtxRetain)(void **, CUdevice);
	CUresult (*primaryCtxRelease)(CUdevice);
	CUresult (*ctxSetCurrent)(void *);
	CUresult (*getErrorName)(CUresult, const char **);
	CUresult (*getErrorString)(CUresult, const char **);
	CUresult (*memAlloc)(CUdeviceptr *, size_t);
	CUresult (*memFree)(CUdeviceptr);
	CUresult (*memHostAlloc)(void **, size_t, unsigned int);
	CUresult (*memFreeHost)(void *);
	CUresult (*memHostRegister)(void *, size_t, unsigned int);
	CUresult (*memHostUnregister)(void *);
	CUresult (*memcpyHtoD)(CUdeviceptr, const void *, size_t);
	CUresult (*memsetD8)(CUdeviceptr, unsigned char, size_t);
	CUresult (*memsetD8Async)(CUdeviceptr, unsigned char, size_t, void *);
	CUresult (*memcpyDtoH)(void *, CUdeviceptr, size_t);
	CUresult (*memcpyHtoDAsync)(CUdeviceptr, const void *, size_t, void *);
	CUresult (*memcpyDtoHAsync)(void *, CUdeviceptr, size_t, void *);
	CUresult (*streamCreate)(void **, unsigned int);
	CUresult (*streamDestroy)(void *);
	CUresult (*streamSynchronize)(void *);
	CUresult (*eventCreate)(void **, unsigned int);
	CUresult (*eventDestroy)(void *);
	CUresult (*eventRecord)(void *, void *);
	CUresult (*eventSynchronize)(void *);
	CUresult (*eventQuery)(void *);
	CUresult (*eventElapsedTime)(float *, void *, void *);
	CUresult (*ipcOpenMemHandle)(CUdeviceptr *, kvIpcHandle, unsigned int);
	CUresult (*ipcCloseMemHandle)(CUdeviceptr);
	// Interprocess events (stream ordering with an engine); NULL where absent.
	CUresult (*ipcGetEventHandle)(kvIpcHandle *, void *);
	CUresult (*ipcOpenEventHandle)(void **, kvIpcHandle);
	// Virtual memory management; NULL where the driver lacks it.
	CUresult (*memCreate)(uint64_t *, size_t, const kvAllocProp *, unsigned long long);
	CUresult (*memRelease)(uint64_t);
	CUresult (*memExport)(void *, uint64_t, int, unsigned long long);
	CUresult (*memImport)(uint64_t *, void *, int);
	CUresult (*memAddressReserve)(CUdeviceptr *, size_t, size_t, CUdeviceptr, unsigned long long);
	CUresult (*memAddressFree)(CUdeviceptr, size_t);
	CUresult (*memMap)(CUdeviceptr, size_t, size_t, uint64_t, unsigned long long);
	CUresult (*memUnmap)(CUdeviceptr, size_t);
	CUresult (*memSetAccess)(CUdeviceptr, size_t, const kvAccessDesc *, size_t);
	CUresult (*memGetGranularity)(size_t *, const kvAllocProp *, int);
	// Batched copies (CUDA 12.8 and later); NULL where absent.
	CUresult (*memcpyBatchAsync)(CUdeviceptr *, CUdeviceptr *, size_t *, size_t, kvMemcpyAttributes *, size_t *, size_t, void *);
	CUresult (*memcpyBatchAsyncOld)(CUdeviceptr *, CUdeviceptr *, size_t *, size_t, kvMemcpyAttributes *, size_t *, size_t, size_t *, void *);
	// Modules and kernel launches (page checks on the GPU); NULL where absent.
	CUresult (*moduleLoadData)(void **, const void *);
	CUresult (*moduleUnload)(void *);
	CUresult (*moduleGetFunction)(void **, void *, const char *);
	CUresult (*launchKernel)(void *, unsigned int, unsigned int, unsigned int, unsigned int, unsigned int, unsigned int,
	                         unsigned int, void *, void **, void **);
	CUresult (*streamWaitEvent)(void *, void *, unsigned int);
	// The JIT linker, to keep the kernels compiled for a GPU; NULL where absent.
	CUresult (*linkCreate)(unsigned int, int *, void **, void **);
	CUresult (*linkAddData)(void *, int, void *, size_t, const char *, unsigned int, int *, void **);
	CUresult (*linkComplete)(void *, void **, size_t *);
	CUresult (*linkDestroy)(void *);
} kv;

static void *kvSym(const char *name, int required, char *err, size_t errlen) {
	void *p = dlsym(kv.lib, name);
	if (p == NULL && required && err[0] == 0) {
		snprintf(err, errlen, "libcuda.so.1 has no symbol %s", name);
	}
	return p;
}

// kvLoad opens the driver library and resolves its entry points. It returns 0, or -1 with a
// message in err.
int kvLoad(char *err, size_t errlen) {
	err[0] = 0;
	kv.lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
	if (kv.lib == NULL) {
		const char *e = dlerror();
		snprintf(err, errlen, "%s", e ? e : "dlopen libcuda.so.1 failed");
		return -1;
	}
#define REQ(field, name) *(void **)(&kv.field) = kvSym(name, 1, err, errlen)
#define OPT(field, name) *(void **)(&kv.field) = kvSym(name, 0, err, errlen)
	REQ(init, "cuInit");
	REQ(driverGetVersion, "cuDriverGetVersion");
	REQ(deviceGetCount, "cuDeviceGetCount");
	REQ(deviceGet, "cuDeviceGet");
	REQ(deviceGetName, "cuDeviceGetName");
	REQ(deviceGetAttribute, "cuDeviceGetAttribute");
	REQ(primaryCtxRetain, "cuDevicePrimaryCtxRetain");
	REQ(primaryCtxRelease, "cuDevicePrimaryCtxRelease_v2");
	REQ(ctxSetCurrent, "cuCtxSetCurrent");
	REQ(getErrorName, "cuGetErrorName");
	REQ(getErrorString, "cuGetErrorString");
	REQ(memAlloc, "cuMemAlloc_v2");
	REQ(memFree, "cuMemFree_v2");
	REQ(memHostAlloc, "cuMemHostAlloc");
	REQ(memFreeHost, "cuMemFreeHost");
	REQ(memHostRegister, "cuMemHostRegister_v2");
	REQ(memHostUnregister, "cuMemHostUnregister");
	REQ(memcpyHtoD, "cuMemcpyHtoD_v2");
	REQ(memsetD8, "cuMemsetD8_v2");
	REQ(memsetD8Async, "cuMemsetD8Async");
	REQ(memcpyDtoH, "cuMemcpyDtoH_v2");
	REQ(memcpyHtoDAsync, "cuMemcpyHtoDAsync_v2");
	REQ(memcpyDtoHAsync, "cuMemcpyDtoHAsync_v2");
	REQ(streamCreate, "cuStreamCreate");
	REQ(streamDestroy, "cuStreamDestroy_v2");
	REQ(streamSynchronize, "cuStreamSynchronize");
	REQ(eventCreate, "cuEventCreate");
	REQ(eventDestroy, "cuEventDestroy_v2");
	REQ(eventRecord, "cuEventRecord");
	REQ(eventSynchronize, "cuEventSynchronize");
	REQ(eventQuery, "cuEventQuery");
	REQ(eventElapsedTime, "cuEventElapsedTime");
	REQ(ipcOpenMemHandle, "cuIpcOpenMemHandle_v2");
	REQ(ipcCloseMemHandle, "cuIpcCloseMemHandle");
	OPT(ipcGetEventHandle, "cuIpcGetEventHandle");
	OPT(ipcOpenEventHandle, "cuIpcOpenEventHandle");
	OPT(memCreate, "cuMemCreate");
	OPT(memRelease, "cuMemRelease");
	OPT(memExport, "cuMemExportToShareableHandle");
	OPT(memImport, "cuMemImportFromShareableHandle");
	OPT(memAddressReserve, "cuMemAddressReserve");
	OPT(memAddressFree, "cuMemAddressFree");
	OPT(memMap, "cuMemMap");
	OPT(memUnmap, "cuMemUnmap");
	OPT(memSetAccess, "cuMemSetAccess");
	OPT(memGetGranularity, "cuMemGetAllocationGranularity");
	OPT(memcpyBatchAsync, "cuMemcpyBatchAsync_v2");
	OPT(memcpyBatchAsyncOld, "cuMemcpyBatchAsync");
	OPT(moduleLoadData, "cuModuleLoadData");
	OPT(moduleUnload, "cuModuleUnload");
	OPT(moduleGetFunction, "cuModuleGetFunction");
	OPT(launchKernel, "cuLaunchKernel");
	OPT(streamWaitEvent, "cuStreamWaitEvent");
	OPT(linkCreate, "cuLinkCreate_v2");
	OPT(linkAddData, "cuLinkAddData_v2");
	OPT(linkComplete, "cuLinkComplete");
	OPT(linkDestroy, "cuLinkDestroy");
#undef REQ
#undef OPT
	if (err[0] != 0) {
		return -1;
	}
	return 0;
}

int kvHasVMM(void) {
	return kv.memCreate && kv.memRelease && kv.memExport && kv.memImport && kv.memAddressReserve &&
		kv.memAddressFree && kv.memMap && kv.memUnmap && kv.memSetAccess && kv.memGetGranularity;
}
int kvHasBatch(void) { return kv.memcpyBatchAsync != NULL || kv.memcpyBatchAsyncOld != NULL; }
int kvHasKernels(void) {
	return kv.moduleLoadData && kv.moduleUnload && kv.moduleGetFunction && kv.launchKernel && kv.streamWaitEvent;
}
// kvLoadModule loads a PTX image as a module of the current context.
CUresult kvLoadModule(uintptr_t *mod, const char *image) {
	void *m = NULL;
	CUresult r = kv.moduleLoadData(&m, image);
	*mod = (uintptr_t)m;
	return r;
}
int kvHasLinker(void) { return kv.linkCreate && kv.linkAddData && kv.linkComplete && kv.linkDestroy; }
// kvCompilePTX compiles a PTX image for the current context's GPU and returns the binary in
// *out (malloc'd, *n bytes; the caller frees it).
CUresult kvCompilePTX(const char *ptx, void **out, size_t *n) {
	void *state = NULL;
	*out = NULL;
	*n = 0;
	CUresult r = kv.linkCreate(0, NULL, NULL, &state);
	if (r != 0) return r;
	// 1 is CU_JIT_INPUT_PTX.
	r = kv.linkAddData(state, 1, (void *)ptx, strlen(ptx) + 1, "pagesum.ptx", 0, NULL, NULL);
	void *bin = NULL;
	size_t size = 0;
	if (r == 0) r = kv.linkComplete(state, &bin, &size);
	if (r == 0) {
		*out = malloc(size);
		if (*out == NULL) {
			r = 2; // CUDA_ERROR_OUT_OF_MEMORY
		} else {
			memcpy(*out, bin, size);
			*n = size;
		}
	}
	kv.linkDestroy(state); // frees bin
	return r;
}
CUresult kvGetFunction(uintptr_t *fn, uintptr_t mod, const char *name) {
	void *f = NULL;
	CUresult r = kv.moduleGetFunction(&f, (void *)mod, name);
	*fn = (uintptr_t)f;
	return r;
}
CUresult kvUnloadModule(uintptr_t mod) { return kv.moduleUnload((void *)mod); }
// kvStreamWaitEvent makes work queued on s after this wait for event e.
CUresult kvStreamWaitEvent(uintptr_t s, uintptr_t e) { return kv.streamWaitEvent((void *)s, (void *)e, 0); }
// kvLaunchUnitCheck launches kvUnitCheck (kernels/pagesum.cu) for n units on stream s, a block
// of threads (UNIT_THREADS) each: pages and pieces are device addresses, secret the 320-byte
// kvSecret, out the address of one 64-bit digest per unit.
CUresult kvLaunchUnitCheck(uintptr_t fn, unsigned int n, unsigned int threads, uintptr_t s, uint64_t pages, uint64_t pieces, const void *secret, uint64_t out) {
	void *args[4] = {&pages, &pieces, (void *)secret, &out};
	return kv.launchKernel((void *)fn, n, 1, 1, threads, 1, 1, 0, (void *)s, args, NULL);
}
// kvLaunchCopies launches kvCopyPieces (kernels/pagesum.cu) with one block of 256 threads per
// copy on stream s; copies is the device address of n kvCopy records.
CUresult kvLaunchCopies(uintptr_t fn, unsigned int n, uintptr_t s, uint64_t copies) {
	void *args[1] = {&copies};
	return kv.launchKernel((void *)fn, n, 1, 1, 256, 1, 1, 0, (void *)s, args, NULL);
}
// kvLaunchCopyCheck launches kvCopyCheck (kernels/pagesum.cu) with one block of 256 threads per
// copy on stream s: copies is the address of n kvCheckedCopy records (in pinned host memory the
// device maps, where scatterFused writes them), secret the 320-byte kvSecret, sums and counts
// the device addresses of the batch's page sums and copy counts, out the address of one 64-bit
// digest per page.
CUresult kvLaunchCopyCheck(uintptr_t fn, unsigned int n, uintptr_t s, uint64_t copies, const void *secret, uint64_t sums, uint64_t counts, uint64_t out) {
	void *args[5] = {&copies, (void *)secret, &sums, &counts, &out};
	return kv.launchKernel((void *)fn, n, 1, 1, 256, 1, 1, 0, (void *)s, args, NULL);
}
// kvMemZero sets n bytes of device memory at p to zero, synchronously.
CUresult kvMemZero(uint64_t p, size_t n) { return kv.memsetD8(p, 0, n); }
// kvMemZeroAsync queues setting n bytes of device memory at p to zero on stream s.
CUresult kvMemZeroAsync(uint64_t p, size_t n, uintptr_t s) { return kv.memsetD8Async(p, 0, n, (void *)s); }
CUresult kvCopyHtoDAsync(uint64_t dst, uintptr_t src, size_t n, uintptr_t s) {
	return kv.memcpyHtoDAsync(dst, (const void *)src, n, (void *)s);
}
CUresult kvCopyDtoHAsync(uintptr_t dst, uint64_t src, size_t n, uintptr_t s) {
	return kv.memcpyDtoHAsync((void *)dst, src, n, (void *)s);
}

CUresult kvInit(void) { return kv.init(0); }
CUresult kvDriverVersion(int *v) { return kv.driverGetVersion(v); }
CUresult kvDeviceCount(int *n) { return kv.deviceGetCount(n); }
CUresult kvDeviceGet(int *d, int ordinal) { return kv.deviceGet(d, ordinal); }
CUresult kvDeviceName(char *buf, int len, int d) { return kv.deviceGetName(buf, len, d); }
CUresult kvDeviceAttr(int *v, int attr, int d) { return kv.deviceGetAttribute(v, attr, d); }
CUresult kvPrimaryRetain(uintptr_t *ctx, int d) {
	void *c = NULL;
	CUresult r = kv.primaryCtxRetain(&c, d);
	*ctx = (uintptr_t)c;
	return r;
}
CUresult kvPrimaryRelease(int d) { return kv.primaryCtxRelease(d); }
CUresult kvSetCurrent(uintptr_t ctx) { return kv.ctxSetCurrent((void *)ctx); }
static const char *kvErrorName(CUresult r) {
	const char *s = NULL;
	if (kv.getErrorName == NULL || kv.getErrorName(r, &s) != 0 || s == NULL) return "CUDA_ERROR_UNKNOWN_CODE";
	return s;
}
static const char *kvErrorString(CUresult r) {
	const char *s = NULL;
	if (kv.getErrorString == NULL || kv.getErrorString(r, &s) != 0 || s == NULL) return "";
	return s;
}
CUresult kvMemAlloc(uint64_t *p, size_t n) { return kv.memAlloc(p, n); }
CUresult kvMemFree(uint64_t p) { return kv.memFree(p); }
CUresult kvHostAlloc(void **p, size_t n, unsigned int flags) { return kv.memHostAlloc(p, n, flags); }
CUresult kvFreeHost(uintptr_t p) { return kv.memFreeHost((void *)p); }
CUresult kvHostRegister(uintptr_t p, size_t n, unsigned int flags) { return kv.memHostRegister((void *)p, n, flags); }
CUresult kvHostUnregister(uintptr_t p) { return kv.memHostUnregister((void *)p); }
CUresult kvCopyHtoD(uint64_t dst, uintptr_t src, size_t n) { return kv.memcpyHtoD(dst, (const void *)src, n); }
CUresult kvCopyDtoH(uintptr_t dst, uint64_t src, size_t n) { return kv.memcpyDtoH((void *)dst, src, n); }
CUresult kvStreamCreate(uintptr_t *s) {
	void *q = NULL;
	CUresult r = kv.streamCreate(&q, 1); // CU_STREAM_NON_BLOCKING
	*s = (uintptr_t)q;
	return r;
}
CUresult kvStreamDestroy(uintptr_t s) { return kv.streamDestroy((void *)s); }
CUresult kvStreamSync(uintptr_t s) { return kv.streamSynchronize((void *)s); }
// kvEventCreate creates an event for ordering and waiting only: CU_EVENT_DISABLE_TIMING, which
// makes recording and waiting cheaper.
CUresult kvEventCreate(uintptr_t *e) {
	void *q = NULL;
	CUresult r = kv.eventCreate(&q, 2);
	*e = (uintptr_t)q;
	return r;
}
CUresult kvEventDestroy(uintptr_t e) { return kv.eventDestroy((void *)e); }
CUresult kvEventRecord(uintptr_t e, uintptr_t s) { return kv.eventRecord((void *)e, (void *)s); }
CUresult kvEventSync(uintptr_t e) { return kv.eventSynchronize((void *)e); }
CUresult kvEventQuery(uintptr_t e) { return kv.eventQuery((void *)e); }
// kvEventCreateTimed creates an event that records a time (for measurements).
CUresult kvEventCreateTimed(uintptr_t *e) {
	void *q = NULL;
	CUresult r = kv.eventCreate(&q, 0);
	*e = (uintptr_t)q;
	return r;
}
CUresult kvEventElapsed(float *ms, uintptr_t a, uintptr_t b) { return kv.eventElapsedTime(ms, (void *)a, (void *)b); }

CUresult kvIpcOpen(uint64_t *p, const void *handle) {
	kvIpcHandle h;
	memcpy(&h, handle, sizeof h);
	return kv.ipcOpenMemHandle(p, h, 1); // CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS
}
CUresult kvIpcClose(uint64_t p) { return kv.ipcCloseMemHandle(p); }

int kvHasIpcEvents(void) { return kv.ipcGetEventHandle && kv.ipcOpenEventHandle && kv.streamWaitEvent; }
// kvIpcEventCreate creates an interprocess event (CU_EVENT_INTERPROCESS |
// CU_EVENT_DISABLE_TIMING) and writes its 64-byte handle to handle.
CUresult kvIpcEventCreate(uintptr_t *e, void *handle) {
	void *q = NULL;
	CUresult r = kv.eventCreate(&q, 4 | 2);
	if (r != 0) return r;
	kvIpcHandle h;
	r = kv.ipcGetEventHandle(&h, q);
	if (r != 0) { kv.eventDestroy(q); return r; }
	memcpy(handle, &h, sizeof h);
	*e = (uintptr_t)q;
	return 0;
}
// kvIpcEventOpen opens another process's interprocess event from its 64-byte handle.
CUresult kvIpcEventOpen(uintptr_t *e, const void *handle) {
	kvIpcHandle h;
	memcpy(&h, handle, sizeof h);
	void *q = NULL;
	CUresult r = kv.ipcOpenEventHandle(&q, h);
	*e = (uintptr_t)q;
	return r;
}
// kvEventCapture makes stream s wait for event src as last recorded, then records a new event
// *dst on s: *dst stands for that record of src from now on, whatever src's owner records later.
CUresult kvEventCapture(uintptr_t s, uintptr_t src, uintptr_t *dst) {
	void *q = NULL;
	CUresult r = kv.eventCreate(&q, 2);
	if (r != 0) return r;
	r = kv.streamWaitEvent((void *)s, (void *)src, 0);
	if (r == 0) r = kv.eventRecord(q, (void *)s);
	if (r != 0) { kv.eventDestroy(q); return r; }
	*dst = (uintptr_t)q;
	return 0;
}
// kvStreamsWaitEvent makes each of n streams wait for event e; it returns the first error.
CUresult kvStreamsWaitEvent(const uintptr_t *streams, int n, uintptr_t e) {
	for (int i = 0; i < n; i++) {
		CUresult r = kv.streamWaitEvent((void *)streams[i], (void *)e, 0);
		if (r != 0) return r;
	}
	return 0;
}

static kvAllocProp kvProp(int ordinal) {
	kvAllocProp prop;
	memset(&prop, 0, sizeof prop);
	prop.type = 1;                 // CU_MEM_ALLOCATION_TYPE_PINNED
	prop.requestedHandleTypes = 1; // CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
	prop.location.type = 1;        // CU_MEM_LOCATION_TYPE_DEVICE
	prop.location.id = ordinal;
	return prop;
}
CUresult kvGranularity(size_t *g, int ordinal) {
	kvAllocProp prop = kvProp(ordinal);
	return kv.memGetGranularity(g, &prop, 0); // CU_MEM_ALLOC_GRANULARITY_MINIMUM
}
// kvMapHandle reserves an address range for size bytes of the allocation h and maps it with
// read-write access from the device.
CUresult kvMapHandle(uint64_t *p, uint64_t h, size_t size, int ordinal) {
	CUdeviceptr va = 0;
	CUresult r = kv.memAddressReserve(&va, size, 0, 0, 0);
	if (r != 0) return r;
	r = kv.memMap(va, size, 0, h, 0);
	if (r != 0) { kv.memAddressFree(va, size); return r; }
	kvAccessDesc acc;
	memset(&acc, 0, sizeof acc);
	acc.location.type = 1;
	acc.location.id = ordinal;
	acc.flags = 3; // CU_MEM_ACCESS_FLAGS_PROT_READWRITE
	r = kv.memSetAccess(va, size, &acc, 1);
	if (r != 0) { kv.memUnmap(va, size); kv.memAddressFree(va, size); return r; }
	*p = va;
	return 0;
}
CUresult kvUnmap(uint64_t p, size_t size) {
	CUresult r = kv.memUnmap(p, size);
	CUresult r2 = kv.memAddressFree(p, size);
	return r != 0 ? r : r2;
}
// kvCreateExportable allocates size bytes of device memory that can be exported as a POSIX
// file descriptor, maps it, and returns the mapping and the descriptor.
CUresult kvCreateExportable(uint64_t *p, int *fd, size_t size, int ordinal) {
	kvAllocProp prop = kvProp(ordinal);
	uint64_t h = 0;
	CUresult r = kv.memCreate(&h, size, &prop, 0);
	if (r != 0) return r;
	r = kvMapHandle(p, h, size, ordinal);
	if (r == 0) r = kv.memExport(fd, h, 1, 0);
	if (r != 0 && *p != 0) { kvUnmap(*p, size); *p = 0; }
	kv.memRelease(h); // the mapping keeps the memory alive
	return r;
}
CUresult kvImportFD(uint64_t *p, int fd, size_t size, int ordinal) {
	uint64_t h = 0;
	CUresult r = kv.memImport(&h, (void *)(uintptr_t)fd, 1);
	if (r != 0) return r;
	r = kvMapHandle(p, h, size, ordinal);
	kv.memRelease(h);
	return r;
}

// kvCopies issues n asynchronous copies between device and pinned host memory, copy i on
// streams[stream[i]]. It returns the first error and its index in *failed.
CUresult kvCopies(int toDevice, int n, const uint64_t *dev, const uint64_t *host, const uint64_t *size,
                         const int32_t *stream, const uintptr_t *streams, int *failed) {
	for (int i = 0; i < n; i++) {
		void *s = (void *)streams[stream[i]];
		CUresult r = toDevice ? kv.memcpyHtoDAsync(dev[i], (const void *)(uintptr_t)host[i], size[i], s)
		                      : kv.memcpyDtoHAsync((void *)(uintptr_t)host[i], dev[i], size[i], s);
		if (r != 0) { *failed = i; return r; }
	}
	return 0;
}

// kvCopiesBatch issues n copies with one batched call on stream s.
CUresult kvCopiesBatch(int toDevice, int n, uint64_t *dev, uint64_t *host, uint64_t *size, uintptr_t s, int ordinal) {
	kvMemcpyAttributes attr;
	memset(&attr, 0, sizeof attr);
	attr.srcAccessOrder = 1; // CU_MEMCPY_SRC_ACCESS_ORDER_STREAM
	kvMemLocation d = {1, ordinal}, h = {2, 0}; // device; host
	attr.srcLocHint = toDevice ? h : d;
	attr.dstLocHint = toDevice ? d : h;
	size_t idx = 0;
	uint64_t *dsts = toDevice ? dev : host, *srcs = toDevice ? host : dev;
	if (kv.memcpyBatchAsync != NULL) {
		return kv.memcpyBatchAsync(dsts, srcs, (size_t *)size, n, &attr, &idx, 1, (void *)s);
	}
	size_t failIdx = 0;
	return kv.memcpyBatchAsyncOld(dsts, srcs, (size_t *)size, n, &attr, &idx, 1, &failIdx, (void *)s);
}
*/
import "C"

import (
	"errors"
	"fmt"
	"sync"
	"unsafe"
)

// ErrNoCUDA is wrapped by the errors of CUDA calls on a machine where the driver library or a
// device is missing.
var ErrNoCUDA = errors.New("no CUDA")

// CUDAError is a failed driver call.
type CUDAError struct {
	Call string
	Code int
	Name string
	Msg  string
}

func (e *CUDAError) Error() string {
	return fmt.Sprintf("%s: %s (%d): %s", e.Call, e.Name, e.Code, e.Msg)
}

func cuErr(call string, r C.CUresult) error {
	if r == 0 {
		return nil
	}
	return &CUDAError{Call: call, Code: int(r), Name: C.GoString(C.kvErrorName(r)), Msg: C.GoString(C.kvErrorString(r))}
}

var (
	driverOnce sync.Once
	driverErr  error
)

// loadDriver opens libcuda.so.1 and initialises the driver once per process.
func loadDriver() error {
	driverOnce.Do(func() {
		var buf [512]C.char
		if C.kvLoad(&buf[0], C.size_t(len(buf))) != 0 {
			driverErr = fmt.Errorf("%w: %s", ErrNoCUDA, C.GoString(&buf[0]))
			return
		}
		if err := cuErr("cuInit", C.kvInit()); err != nil {
			driverErr = fmt.Errorf("%w: %w", ErrNoCUDA, err)
		}
	})
	return driverErr
}

// CUDADriverVersion returns the driver's CUDA version as major·1000 + minor·10.
func CUDADriverVersion() (int, error) {
	if err := loadDriver(); err != nil {
		return 0, err
	}
	var v C.int
	return int(v), cuErr("cuDriverGetVersion", C.kvDriverVersion(&v))
}

// CUDADeviceCount returns the number of CUDA devices, 0 with an error wrapping ErrNoCUDA where
// there is no driver.
func CUDADeviceCount() (int, error) {
	if err := loadDriver(); err != nil {
		return 0, err
	}
	var n C.int
	if err := cuErr("cuDeviceGetCount", C.kvDeviceCount(&n)); err != nil {
		return 0, fmt.Errorf("%w: %w", ErrNoCUDA, err)
	}
	return int(n), nil
}

func ptrOf(b []byte) uintptr { return uintptr(unsafe.Pointer(unsafe.SliceData(b))) }
