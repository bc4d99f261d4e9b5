/* The public headers compile as C11, and a program using the dlsym helper
 * runs unchanged when liballocscope.so is not loaded: every call is a no-op.
 * (Exit 0 = pass; the LD_PRELOAD end-to-end test covers the loaded case.) */
#include <allocscope/allocscope.h>
#include <allocscope/allocscope_dl.h>
#include <stdio.h>

static char block_for_derived[8];

int main(void) {
    if (allocscope_dl_available()) {
        fprintf(stderr, "allocscope API resolved although the interposer is not loaded\n");
        return 1;
    }
    allocscope_dl_step(1);
    allocscope_dl_push("layers.0", "forward");
    allocscope_dl_register_param("layers.0", "w", 16, "bf16", 8);
    allocscope_dl_mark("note");
    allocscope_dl_derived(block_for_derived, "layers.0", "weight", "cast");
    int block[4];
    allocscope_dl_block_alloc(block, sizeof block, 0, NULL);
    allocscope_dl_block_free(block);
    allocscope_dl_allocator_counters(0, 1024, 2048, 0);
    allocscope_dl_pop();
    char value[16] = "unchanged";
    if (allocscope_dl_config_get("ALLOCSCOPE_LOG", value, sizeof value) != -1 || value[0] != '\0') {
        fprintf(stderr, "allocscope_dl_config_get answered without the interposer\n");
        return 1;
    }
    if (allocscope_dl()->push != NULL) return 1;
    puts("ok");
    return 0;
}
