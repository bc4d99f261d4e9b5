/* Test library "test-nosym": a shared library without a plugin descriptor
 * symbol (none of allocscope_plugin_v2, allocscope_plugin_v1, allocscope_plugin). */
__attribute__((visibility("default"))) int allocscope_plugin_v0 = 1;
