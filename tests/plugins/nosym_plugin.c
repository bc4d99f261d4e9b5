/* Test library "test-nosym": a shared library without a plugin descriptor
 * symbol (neither allocscope_plugin_v1 nor allocscope_plugin). */
__attribute__((visibility("default"))) int allocscope_plugin_v0 = 1;
