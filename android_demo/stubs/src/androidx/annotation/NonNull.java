// API stub (signatures only) of androidx.annotation.NonNull.
// Mirrors androidx/annotation/annotation/src/jvmMain/java/androidx/annotation/NonNull.java (androidx.annotation:annotation 1.8.0).
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
