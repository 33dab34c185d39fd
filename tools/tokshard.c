#include <stdio.h>
int main(void) { puts("tokshard: not built yet"); return 2; }
