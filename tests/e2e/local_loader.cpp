// local_loader LIB: loads LIB (tests/e2e/local_caller.cpp) with
// dlopen(RTLD_LOCAL) and lets it allocate 5555 bytes. This program does not
// link the CUDA runtime itself, so libcudart.so.13 arrives only as LIB's
// dependency, outside the global scope, as under Python.
#include <dlfcn.h>

#include <cstddef>
#include <cstdio>

int main(int argc, char** argv) {
    if (argc != 2) {
        std::fprintf(stderr, "usage: local_loader LIB\n");
        return 2;
    }
    void* lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    auto* fn =
        lib ? reinterpret_cast<int (*)(size_t)>(dlsym(lib, "local_caller_alloc_free")) : nullptr;
    if (!fn) {
        std::fprintf(stderr, "local_loader: %s\n", dlerror());
        return 1;
    }
    int rc = fn(5555);
    std::printf("local done: %d\n", rc);
    return rc;
}
