/* Test library "test-nosym": a shared library without the allocscope_plugin
 * symbol. */
__attribute__((visibility("default"))) int allocscope_plugin_v0 = 1;
