/* placeholder translation unit for a module that has no sources yet */
typedef int mla_empty_translation_unit;
