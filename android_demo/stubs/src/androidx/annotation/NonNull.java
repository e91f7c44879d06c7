// API stub (signatures only) of androidx.annotation.NonNull.
// Mirrors androidx/annotation/annotation/src/jvmMain/kotlin/androidx/annotation/NonNull.kt (androidx.annotation:annotation 1.8.0).
// Checked against: androidx/androidx@17a86409267b91bae5511d31a3679abb84064285:annotation/annotation/src/jvmMain/kotlin/androidx/annotation/NonNull.kt (BINARY retention = CLASS; Java targets METHOD, PARAMETER, FIELD, LOCAL_VARIABLE, ANNOTATION_TYPE, PACKAGE)
// Only the members android_demo/app uses; bodies throw. Not shipped: the real library is on the device.
package androidx.annotation;

import java.lang.annotation.Documented;
import java.lang.annotation.ElementType;
import java.lang.annotation.Retention;
import java.lang.annotation.RetentionPolicy;
import java.lang.annotation.Target;

@Documented
@Retention(RetentionPolicy.CLASS)
@Target({ElementType.METHOD, ElementType.PARAMETER, ElementType.FIELD, ElementType.LOCAL_VARIABLE, ElementType.ANNOTATION_TYPE, ElementType.PACKAGE})
public @interface NonNull {}
